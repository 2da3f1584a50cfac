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
};

enum class OpKind : int32_t {
  GetRows = 0,    // dst[i] = dequant(src0[src1[i]])            src0: table, src1: I32 ids
  RmsNorm = 1,    // dst = src0 / rms(src0) * src1              f[0]: eps
  Quantize = 2,   // dst(Q8A) = quantize(src0 f32)
  MatMul = 3,     // dst[t][r] = dot(src0 row r, src1 row t)    src0: weight [r, K], src1: [t, K]
  Rope = 4,       // in place allowed; src1: positions          i[0]: heads, i[1]: head_dim; f[0]: base
  KvStore = 5,    // dst(F16 state)[src1[t]] = src0[t]
  Attention = 6,  // src0: q, src1: K cache, src2: V cache, src3: positions  i[0]: heads, i[1]: kv heads, i[2]: head_dim; f[0]: scale
  Add = 7,        // dst = src0 + src1
  SiluMul = 8,    // dst = silu(src0) * src1
  SelectRows = 9, // dst[o] = src0[src1[o]]                     src1: I32 row ids of this batch
};
const char* op_name(OpKind op);

struct Node {
  OpKind op = OpKind::Add;
  int dst = -1;
  std::array<int, 4> src{{-1, -1, -1, -1}};
  std::array<int32_t, 4> i{{0, 0, 0, 0}};
  std::array<float, 4> f{{0.f, 0.f, 0.f, 0.f}};
  int backend = 0;  // index into the engine's backend list
};

// Thrown for graphs or runs that make no sense; the bindings map it to ValueError.
struct GraphError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Graph {
 public:
  int add_tensor(Tensor t);
  int add_node(const Node& n);
  // Checks shapes and types of every node; throws GraphError naming the first bad node.
  void validate() const;

  std::vector<Tensor> tensors;
  std::vector<Node> nodes;
  // Named roles that each run binds or reads.
  int input_tokens = -1;     // I32 [tokens]
  int input_positions = -1;  // I32 [tokens]
  int input_out_ids = -1;    // I32 [outputs]: which batch rows produce logits
  int output_logits = -1;    // F32 [outputs, vocab]
  // Scratch tensors whose memory is never reused, so they can be read after a run (tests, debugging).
  std::vector<int> pinned;
};

}  // namespace pyinfer
