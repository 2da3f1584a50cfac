// The op graph: tensors and nodes, built once per model, computed many times.
#pragma once
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "graph/dtype.h"
#include "graph/op_params.h"

namespace pyinfer {

// How many rows a tensor has in a given run.
enum class RowMode : int32_t {
  Fixed = 0,    // weights and persistent state (KV cache): `rows` always
  Tokens = 1,   // one row per token of the current batch (capacity: max_tokens)
  Outputs = 2,  // one row per requested output (capacity: max_outputs)
};

enum class Storage : int32_t {
  External = 0,  // weights: memory owned by the caller (a memory-mapped GGUF)
  Scratch = 1,   // activations: lifetime-limited, buffers reused across the graph
  State = 2,     // persists across runs (KV cache); zero-initialised once
  Input = 3,     // I32 inputs bound by each run (token ids, positions, output ids)
};

struct Tensor {
  std::string name;
  DType type = DType::F32;
  int64_t cols = 0;   // elements per row
  int64_t rows = 0;   // for RowMode::Fixed; capacity otherwise (set by the engine)
  RowMode row_mode = RowMode::Fixed;
  Storage storage = Storage::Scratch;
  size_t row_bytes = 0;   // bytes of one row's elements
  size_t row_stride = 0;  // bytes from one row to the next: row_bytes, or wider for a view of some columns
  // A view owns no memory: it reads and writes tensor `view_of`'s bytes from `offset` on (Graph::add_view).
  int view_of = -1;
  size_t offset = 0;
  void* data = nullptr;  // bound by the engine (Scratch/State/Input and views) or the caller (External)
  // Which memory holds it: 0 is host memory; a backend with memory of its own (a GPU) has another id. Set by
  // the engine: where the first node that writes it runs, or for a mirror the memory it was copied into.
  int memory = 0;
  int copy_of = -1;  // an engine-made copy of this tensor in another memory space (copy_planner.h)
  // A paged weight (offload/neuron_store.h): `data` is a table of `rows` row pointers that a NeuronFetch
  // node makes valid before the weight is read.
  bool paged = false;
  // For a paged weight, what its table holds: one pointer per row (a neuron store) or, when experts > 0, one
  // pointer per expert of `experts` (an expert store: each expert's rows lie together behind its pointer).
  int64_t experts = 0;
};

// What each op computes. Sources are named per op (op_params.h: the *Src slots), scalar parameters too
// (the *Params structs). An "active list" is I32 [T, n_ff + 1]: a count, then ids ascending.
enum class OpKind : int32_t {
  GetRows = 0,     // dst[i] = dequant(table[ids[i]]) * scale
  RmsNorm = 1,     // dst = x / rms(x) * weight, per row or per segment
  Quantize = 2,    // dst(Q8A) = quantize(x f32)
  MatMul = 3,      // dst[t][r] = dot(weight row r, x row t); with `active`, only the listed rows (gather-GEMV)
  Rope = 4,        // rotary position embedding, in place allowed
  KvStore = 5,     // dst(F16 or Q8_0 KV cache)[rows[t]] = x[t]
  Attention = 6,   // causal attention of q over the K/V caches (paged with `table`)
  Add = 7,         // dst = a + b
  SiluMul = 8,     // dst = act(gate) * up
  SelectRows = 9,  // dst[o] = x[rows[o]]
  // ---- neuron-aware (sparse FFN) ops
  BiasRelu = 10,     // dst = max(0, x + bias)
  ActiveSet = 11,    // dst (active lists) from predictor scores or a threshold
  GatedAct = 12,     // dst[j] = act(gate[j]) * up[j], or 0 under the threshold, for j in the list (others untouched)
  DownAxpy = 13,     // dst[t] = sum_{j in list} act[t][j] * down[row_map(j)]
  ScatterCols = 14,  // dst[t][perm[k]] = x[t][k]
  ActiveUnion = 15,  // dst (I32 state [1, n_ff + 1]) = the union of the tokens' lists, or count -1 ("run dense")
  NeuronFetch = 16,  // rows: every row (or the union's rows) of a layer's paged FFN weights becomes readable;
                     //   release: the layer's readers are done, its buffer may be reused; dense down: a dense
                     //   run's original down matrix is read whole (offload/neuron_store.h).
                     //   dst: I32 state [1, 1], untouched (it orders the fetch before the FFN's readers)
  Copy = 17,         // dst = x, row by row: a tensor carried into another memory space (the engine inserts
                     //   these where a node reads a tensor that lives in another backend's memory)
  // ---- Mixture of Experts (a route is F32 [T, 2k]: each token's k expert weights, then their ids as floats)
  MoeRoute = 18,     // dst (route) = the top k experts of softmax or sigmoid(router logits), weights renormalized
  MoeMatMul = 19,    // dst[t][s*rows_e + r] = dot(expert route[t].id[s]'s row r, x[t] or its slot s segment):
                     //   llama.cpp's mul_mat_id, only the chosen experts' rows, tokens grouped by expert; with a
                     //   gate and cuts, one token computes only the rows whose gate passes (op_params.h)
  MoeCombine = 20,   // dst[t] = sum_s route[t].w[s] * experts[t][slot s] (+ sigmoid(shared_gate[t]) * shared[t])
  ExpertFetch = 21,  // the experts a route chose for a layer become readable (offload/expert_store.h); dst: I32
                     //   state [1, 1], untouched (it orders the fetch before the layer's expert matmuls)
  MoeRouteSplit = 22,  // dst = one backend's share of a route: slot s keeps its weight and becomes local id
                       //   map[id] where the map has one (>= 0); else weight 0 and id -1, a slot the expert
                       //   matmul leaves at 0 (experts placed on two backends: PowerInfer's split by expert)
  // ---- recurrent layers (op_params.h: the state rows and their reset)
  SsmConv = 23,      // dst[t] = (silu) causal conv1d of x over each channel's last K inputs, state rolled on
  DeltaNet = 24,     // dst[t] = the gated delta rule's read-out of q[t] after its state update by k[t], v[t]
  // ---- element-wise
  Softcap = 25,      // dst = cap * tanh(x / cap) (Gemma's final logits)
  Count              // number of op kinds (not an op)
};
constexpr int kOpKinds = static_cast<int>(OpKind::Count);
const char* op_name(OpKind op);

// Prefill runs dense, decode runs sparse: nodes of one path are skipped in runs of the other.
enum class RunIf : int32_t {
  Always = 0,
  SingleToken = 1,  // runs with exactly one token (decode)
  MultiToken = 2,   // runs with more than one token (prefill)
};

// When a node runs: part of the graph's meaning, evaluated by the executor (executor/guards.h).
// Sparse or dense FFN per run: an ActiveUnion node decides once per layer, the nodes of each path follow
// its decision.
struct NodeGuard {
  RunIf run_if = RunIf::Always;
  int32_t max_tokens = 0;  // runs only with at most this many tokens (0: any number)
  int when_list = -1;      // an ActiveUnion result: runs only when its count is >= 0 (when_sparse) or -1
  bool when_sparse = true;
  int32_t min_tokens = 0;  // runs only with at least this many tokens (0: any number)
};

struct Node {
  OpKind op = OpKind::Add;
  int dst = -1;
  std::array<int, kMaxSources> src{{-1, -1, -1, -1, -1, -1, -1}};  // slots named per op (op_params.h)
  OpParams p;                                        // the member named after the op (p.rope, ...)
  NodeGuard guard;
};

// One fixed row (a bias): Add adds it to every row of its other source.
inline bool is_bias_row(const Tensor& t) { return t.row_mode == RowMode::Fixed && t.rows == 1; }

// Thrown for graphs or runs that make no sense; the bindings map it to ValueError.
struct GraphError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Size limits that keep every byte count of the graph far from overflow (int32 ids index rows anyway).
constexpr int64_t kMaxCols = int64_t(1) << 31;
constexpr int64_t kMaxRows = int64_t(1) << 40;
// rows * row_bytes, or GraphError naming the tensor when it would overflow.
size_t checked_bytes(const std::string& name, int64_t rows, size_t row_bytes);

class Graph {
 public:
  int add_tensor(Tensor t);
  // A view of `base`: `cols` elements per row, `rows` rows (a fixed-row base; per-token and per-output views
  // have one row per base row), starting `offset` bytes into the base, rows `row_stride` bytes apart
  // (0: the base's stride). Rows of a weight ([hot, n) of a gate), columns of an activation (q of a fused qkv).
  // Throws GraphError when the view leaves the base, or its base is an index tensor or paged.
  int add_view(const std::string& name, int base, int64_t cols, int64_t rows, size_t offset, size_t row_stride);
  int add_node(const Node& n);
  // Checks shapes and types of every node; throws GraphError naming the first bad node.
  void validate() const;
  // The tensor a copy was made of (following copies of copies), or id itself: what checks of provenance
  // (an input, a constant, a list, a weight) look at.
  int origin(int id) const {
    while (id >= 0 && tensors[size_t(id)].copy_of >= 0) id = tensors[size_t(id)].copy_of;
    return id;
  }
  // Which named input a tensor is ("tokens", "positions", ...), or nullptr.
  const char* input_role(int id) const;
  std::vector<Tensor> tensors;
  std::vector<Node> nodes;
  // Named roles that each run binds or reads.
  int input_tokens = -1;     // I32 [tokens]
  int input_positions = -1;  // I32 [tokens]
  int input_out_ids = -1;    // I32 [outputs]: which batch rows produce logits
  // Paged KV (continuous batching): the cache row each token's K/V is written to, and each token's
  // sequence's block table. Absent in single-sequence graphs, where the row is the position.
  int input_slots = -1;      // I32 [tokens]
  int input_kv_table = -1;   // I32 [tokens, max blocks per sequence]
  // Recurrent layers of many sequences (a hybrid model's paged graph): each token's sequence's state row.
  int input_state_rows = -1;  // I32 [tokens]
  int output_logits = -1;    // F32 [outputs, vocab]
  // Scratch tensors whose memory is never reused, so they can be read after a run (tests, debugging).
  std::vector<int> pinned;
};

}  // namespace pyinfer
