#include "graph/graph.h"

#include <vector>

namespace pyinfer {

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::GetRows: return "get_rows";
    case OpKind::RmsNorm: return "rms_norm";
    case OpKind::Quantize: return "quantize";
    case OpKind::MatMul: return "mat_mul";
    case OpKind::Rope: return "rope";
    case OpKind::KvStore: return "kv_store";
    case OpKind::Attention: return "attention";
    case OpKind::Add: return "add";
    case OpKind::SiluMul: return "silu_mul";
    case OpKind::SelectRows: return "select_rows";
    case OpKind::BiasRelu: return "bias_relu";
    case OpKind::ActiveSet: return "active_set";
    case OpKind::GatedAct: return "gated_act";
    case OpKind::DownAxpy: return "down_axpy";
    case OpKind::ScatterCols: return "scatter_cols";
    case OpKind::ActiveUnion: return "active_union";
  }
  return "?";
}

int Graph::add_tensor(Tensor t) {
  if (!dtype_is_known(t.type)) throw GraphError("tensor '" + t.name + "': unknown dtype");
  if (t.cols <= 0) throw GraphError("tensor '" + t.name + "': cols must be positive");
  if (dtype_is_quantized(t.type) && t.cols % kQuantBlock != 0)
    throw GraphError("tensor '" + t.name + "': quantized row length must be a multiple of 32");
  t.row_bytes = dtype_row_bytes(t.type, t.cols);
  tensors.push_back(std::move(t));
  return static_cast<int>(tensors.size()) - 1;
}

int Graph::add_node(const Node& n) {
  nodes.push_back(n);
  return static_cast<int>(nodes.size()) - 1;
}

namespace {

struct NodeChecker {
  const Graph& g;
  const Node& n;
  size_t index;

  [[noreturn]] void fail(const std::string& why) const {
    throw GraphError("node " + std::to_string(index) + " (" + op_name(n.op) + "): " + why);
  }
  const Tensor& t(int id) const {
    if (id < 0 || id >= static_cast<int>(g.tensors.size())) fail("tensor id out of range");
    return g.tensors[id];
  }
  void type(int id, DType want) const {
    if (t(id).type != want)
      fail("tensor '" + t(id).name + "' is " + dtype_name(t(id).type) + ", expected " + dtype_name(want));
  }
  void cols(int id, int64_t want) const {
    if (t(id).cols != want)
      fail("tensor '" + t(id).name + "' has " + std::to_string(t(id).cols) + " columns, expected " +
           std::to_string(want));
  }
};

}  // namespace

void Graph::validate() const {
  std::vector<bool> union_written(tensors.size(), false);
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    NodeChecker c{*this, n, k};
    const Tensor& d = c.t(n.dst);
    if (n.when_list >= 0) {  // checked before this node's own result counts (no node guards itself)
      c.t(n.when_list);      // range check
      if (!union_written[size_t(n.when_list)]) c.fail("when_list must be the result of an earlier ActiveUnion node");
    }
    if (n.max_tokens < 0) c.fail("max_tokens must be >= 0");
    switch (n.op) {
      case OpKind::GetRows:
        c.type(n.dst, DType::F32); c.type(n.src[1], DType::I32); c.cols(n.src[0], d.cols);
        break;
      case OpKind::RmsNorm:
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32); c.type(n.src[1], DType::F32);
        c.cols(n.src[0], d.cols); c.cols(n.src[1], d.cols);
        break;
      case OpKind::Quantize:
        c.type(n.dst, DType::Q8A); c.type(n.src[0], DType::F32); c.cols(n.src[0], d.cols);
        break;
      case OpKind::MatMul: {
        const Tensor& w = c.t(n.src[0]);
        c.type(n.dst, DType::F32);
        c.cols(n.src[1], w.cols);
        if (d.cols != w.rows) c.fail("dst columns must equal weight rows");
        const bool q = w.type == DType::Q4_0 || w.type == DType::Q4_1 || w.type == DType::Q8_0;
        c.type(n.src[1], q ? DType::Q8A : DType::F32);
        if (n.src[2] >= 0) {  // a list per token, or one list (a union) for every token
          c.type(n.src[2], DType::I32); c.cols(n.src[2], w.rows + 1);
          const Tensor& l = c.t(n.src[2]);
          if (l.row_mode == RowMode::Fixed && l.rows != 1) c.fail("a shared active list has one row");
        }
        break;
      }
      case OpKind::Rope:
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32); c.type(n.src[1], DType::I32);
        if (int64_t(n.i[0]) * n.i[1] != d.cols || n.i[1] % 2) c.fail("heads * head_dim must equal columns");
        break;
      case OpKind::KvStore:
        c.type(n.dst, DType::F16); c.type(n.src[0], DType::F32); c.type(n.src[1], DType::I32);
        c.cols(n.src[0], d.cols);
        if (d.storage != Storage::State) c.fail("KV cache must be state");
        break;
      case OpKind::Attention:
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32);
        c.type(n.src[1], DType::F16); c.type(n.src[2], DType::F16); c.type(n.src[3], DType::I32);
        if (n.i[1] <= 0 || n.i[0] % n.i[1]) c.fail("heads must be a multiple of kv heads");
        c.cols(n.src[0], int64_t(n.i[0]) * n.i[2]); c.cols(n.dst, int64_t(n.i[0]) * n.i[2]);
        c.cols(n.src[1], int64_t(n.i[1]) * n.i[2]); c.cols(n.src[2], int64_t(n.i[1]) * n.i[2]);
        if (n.src[4] >= 0) {
          c.type(n.src[4], DType::I32);
          if (n.i[3] < 1) c.fail("paged attention needs a block size");
        }
        break;
      case OpKind::Add:
      case OpKind::SiluMul:
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32); c.type(n.src[1], DType::F32);
        c.cols(n.src[0], d.cols); c.cols(n.src[1], d.cols);
        break;
      case OpKind::SelectRows:
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32); c.type(n.src[1], DType::I32);
        c.cols(n.src[0], d.cols);
        break;
      case OpKind::BiasRelu:
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32); c.type(n.src[1], DType::F32);
        c.cols(n.src[0], d.cols); c.cols(n.src[1], d.cols);
        break;
      case OpKind::ActiveSet: {
        c.type(n.dst, DType::I32); c.type(n.src[0], DType::F32); c.cols(n.dst, int64_t(n.i[0]) + 1);
        if (n.i[1] < 0 || n.i[1] > n.i[0]) c.fail("hot prefix out of range");
        if (n.i[2] == 0) {
          c.cols(n.src[0], int64_t(n.i[0]) - n.i[1]); c.type(n.src[1], DType::F32);
          c.cols(n.src[1], int64_t(n.i[0]) - n.i[1]);
        } else if (n.i[2] == 1) {
          c.cols(n.src[0], n.i[0]);
        } else {
          c.fail("unknown mode");
        }
        break;
      }
      case OpKind::GatedAct:
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32); c.type(n.src[1], DType::F32);
        c.type(n.src[2], DType::I32);
        c.cols(n.src[0], d.cols); c.cols(n.src[1], d.cols); c.cols(n.src[2], d.cols + 1);
        break;
      case OpKind::DownAxpy: {
        const Tensor& w = c.t(n.src[0]);
        c.type(n.dst, DType::F32); c.type(n.src[1], DType::F32); c.type(n.src[2], DType::I32);
        if (w.type != DType::Q8_0 && w.type != DType::Q4_1 && w.type != DType::Q4T && w.type != DType::F32 &&
            w.type != DType::F16)
          c.fail("neuron-major down must be Q4T, Q4_1, Q8_0, F32 or F16");
        c.cols(n.src[0], d.cols); c.cols(n.src[1], w.rows); c.cols(n.src[2], w.rows + 1);
        if (w.type == DType::Q4T) {
          c.type(n.src[3], DType::F16); c.cols(n.src[3], 2 * d.cols);
          if (w.rows % kQuantBlock || c.t(n.src[3]).rows != w.rows / kQuantBlock) c.fail("Q4T needs n_ff / 32 scale rows");
        }
        if (n.src[4] >= 0) {
          c.type(n.src[4], DType::I32); c.cols(n.src[4], w.rows);
          if (const auto* map = static_cast<const int32_t*>(c.t(n.src[4]).data))
            for (int64_t k = 0; k < w.rows; ++k)
              if (map[k] < 0 || map[k] >= w.rows) c.fail("row map entry out of range");
        }
        break;
      }
      case OpKind::ScatterCols:
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32); c.type(n.src[1], DType::I32);
        c.cols(n.src[0], d.cols); c.cols(n.src[1], d.cols);
        if (const auto* perm = static_cast<const int32_t*>(c.t(n.src[1]).data))
          for (int64_t k = 0; k < d.cols; ++k)
            if (perm[k] < 0 || perm[k] >= d.cols) c.fail("permutation entry out of range");
        break;
      case OpKind::ActiveUnion:
        c.type(n.dst, DType::I32); c.type(n.src[0], DType::I32);
        c.cols(n.dst, int64_t(n.i[0]) + 1); c.cols(n.src[0], int64_t(n.i[0]) + 1);
        if (d.row_mode != RowMode::Fixed || d.rows != 1 || d.storage != Storage::State)
          c.fail("the union is one row of state");
        if (n.i[1] < 1) c.fail("the token limit must be at least 1");
        union_written[size_t(n.dst)] = true;
        break;
      default:
        c.fail("unknown op");
    }
  }
}

}  // namespace pyinfer
