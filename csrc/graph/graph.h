// The op graph: tensors and nodes, built once per model, computed many times.
#pragma once
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "graph/dtype.h"

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
  size_t row_bytes = 0;
  void* data = nullptr;  // bound by the engine (Scratch/State/Input) or the caller (External)
  // A paged weight (offload/neuron_store.h): `data` is a table of `rows` row pointers that a NeuronFetch
  // node makes valid before the weight is read.
  bool paged = false;
};

enum class OpKind : int32_t {
  GetRows = 0,    // dst[i] = dequant(src0[src1[i]]) * f[0]     src0: table, src1: I32 ids; f[0]: scale (0: none)
  RmsNorm = 1,    // dst = src0 / rms(src0) * src1              f[0]: eps; i[0]: segment (0: row), src1 [1, segment]
  Quantize = 2,   // dst(Q8A) = quantize(src0 f32)
  MatMul = 3,     // dst[t][r] = dot(src0 row r, src1 row t)    src0: weight [r, K], src1: [t, K]
                  //   with src2 (active list): only rows r in token t's list are written (gather-GEMV)
  Rope = 4,       // in place allowed; src1: positions          i[0]: heads, i[1]: head_dim, i[2]: RopeMode; f[0]: base
  KvStore = 5,    // dst(F16 or Q8_0 state)[src1[t]] = src0[t]
  Attention = 6,  // src0: q, src1: K cache, src2: V cache (F16 or Q8_0), src3: positions  i[0]: heads, i[1]: kv heads,
                  //   i[2]: head_dim, i[4]: sliding window (0: none); f[0]: scale
                  //   paged (many sequences): src4: I32 [T, max blocks] block table of each token's sequence, i[3]: block size
  Add = 7,        // dst = src0 + src1
  SiluMul = 8,    // dst = act(src0) * src1                     i[0]: Activation (ops_float.h)
  SelectRows = 9, // dst[o] = src0[src1[o]]                     src1: I32 row ids of this batch
  // ---- neuron-aware (sparse FFN) ops. An "active list" is I32 [T, n_ff + 1]: a count, then ids ascending.
  BiasRelu = 10,  // dst = max(0, src0 + src1[0])               src1: F32 [1, cols] bias
  ActiveSet = 11, // dst(active list) from src0 scores          i[0]: n_ff, i[1]: hot prefix, i[2]: mode; f[0]: t
                  //   mode 0 (predictor): [0, hot) + {hot + j : src0[j] > src1[0][j]}, src1: F32 [1, n_ff - hot]
                  //   mode 1 (threshold): {j : |f(src0[j])| > t}, f = identity, or SiLU when i[3] == 1
  GatedAct = 12,  // dst[j] = act(src0[j]) * src1[j], or 0 when |.| <= f[0], for j in list src2 (other columns untouched)
                  //   i[0]: Activation (ops_float.h)
  DownAxpy = 13,  // dst[t] = sum_{j in list src2} src1[t][j] * src0[row(j)]   src0: neuron-major down [n_ff, d]
                  //   src3: group scales F16 [n_ff / 32, 2d] (Q4T only); src4: I32 [1, n_ff] row(j) (else j)
  ScatterCols = 14,  // dst[t][src1[0][k]] = src0[t][k]          src1: I32 [1, n] permutation
  ActiveUnion = 15,  // dst (I32 state [1, n_ff + 1]) = the union of the tokens' active lists src0, ascending,
                     //   or count -1 ("run dense") when the run has more than i[1] tokens, or when the mean
                     //   list density exceeds f[0] or the union's density f[1] (one token: the density f[2]).
                     //   i[0]: n_ff
  NeuronFetch = 16,  // i[1] = 0: makes every row of layer i[0]'s paged FFN weights readable; i[1] = 1: the
                     //   layer's readers are done, its buffer may be reused (offload/neuron_store.h).
                     //   dst: I32 state [1, 1], untouched (it orders the fetch before the FFN's readers);
                     //   src0 (optional): an ActiveUnion result, the rows this run needs (count -1: all)
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
inline bool node_runs(RunIf r, int64_t n_tokens) {
  return r == RunIf::Always || (r == RunIf::SingleToken) == (n_tokens == 1);
}

struct Node {
  OpKind op = OpKind::Add;
  int dst = -1;
  std::array<int, 6> src{{-1, -1, -1, -1, -1, -1}};
  std::array<int32_t, 6> i{{0, 0, 0, 0, 0, 0}};
  std::array<float, 4> f{{0.f, 0.f, 0.f, 0.f}};
  int backend = 0;  // index into the engine's backend list
  RunIf run_if = RunIf::Always;
  // Sparse or dense FFN per run: an ActiveUnion node decides once per layer, the nodes of each path
  // follow its decision (all threads read the same count after the barrier, so they agree).
  int32_t max_tokens = 0;   // runs only with at most this many tokens (0: any number)
  int when_list = -1;       // an ActiveUnion result: runs only when its count is >= 0 (when_sparse) or -1
  bool when_sparse = true;
};

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
  int add_node(const Node& n);
  // Checks shapes and types of every node; throws GraphError naming the first bad node.
  void validate() const;
  // Which named input a tensor is ("tokens", "positions", ...), or nullptr.
  const char* input_role(int id) const;
  // Whether node n runs in a run of n_tokens tokens (its RunIf, token cap and ActiveUnion decision).
  bool node_runs(const Node& n, int64_t n_tokens) const {
    if (!pyinfer::node_runs(n.run_if, n_tokens) || (n.max_tokens > 0 && n_tokens > n.max_tokens)) return false;
    return n.when_list < 0 || (*static_cast<const int32_t*>(tensors[size_t(n.when_list)].data) >= 0) == n.when_sparse;
  }

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
  int output_logits = -1;    // F32 [outputs, vocab]
  // Scratch tensors whose memory is never reused, so they can be read after a run (tests, debugging).
  std::vector<int> pinned;
};

}  // namespace pyinfer
