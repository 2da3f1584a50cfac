#include "graph/graph.h"

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
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    NodeChecker c{*this, n, k};
    const Tensor& d = c.t(n.dst);
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
      default:
        c.fail("unknown op");
    }
  }
}

}  // namespace pyinfer
