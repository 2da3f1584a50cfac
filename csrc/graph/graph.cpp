#include "graph/graph.h"

#include "graph/op_params.h"

#include <cmath>
#include <initializer_list>
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
    case OpKind::NeuronFetch: return "neuron_fetch";
    case OpKind::Count: break;
  }
  return "?";
}

size_t checked_bytes(const std::string& name, int64_t rows, size_t row_bytes) {
  size_t bytes = 0;
  if (rows < 0 || __builtin_mul_overflow(size_t(rows), row_bytes, &bytes) || bytes > (size_t(1) << 48))
    throw GraphError("tensor '" + name + "': " + std::to_string(rows) + " rows of " + std::to_string(row_bytes) +
                     " bytes is too large");
  return bytes;
}

int Graph::add_tensor(Tensor t) {
  if (!dtype_is_known(t.type)) throw GraphError("tensor '" + t.name + "': unknown dtype");
  if (t.cols <= 0 || t.cols > kMaxCols)
    throw GraphError("tensor '" + t.name + "': cols must be in [1, 2^31], got " + std::to_string(t.cols));
  if (t.rows < 0 || t.rows > kMaxRows)
    throw GraphError("tensor '" + t.name + "': rows must be in [0, 2^40], got " + std::to_string(t.rows));
  if (t.cols % dtype_block_elems(t.type) != 0)
    throw GraphError("tensor '" + t.name + "': a " + dtype_name(t.type) + " row length must be a multiple of " +
                     std::to_string(dtype_block_elems(t.type)) + ", got " + std::to_string(t.cols));
  t.row_bytes = dtype_row_bytes(t.type, t.cols);
  checked_bytes(t.name, t.rows, t.row_bytes);
  tensors.push_back(std::move(t));
  return static_cast<int>(tensors.size()) - 1;
}

int Graph::add_node(const Node& n) {
  nodes.push_back(n);
  return static_cast<int>(nodes.size()) - 1;
}

const char* Graph::input_role(int id) const {
  if (id < 0) return nullptr;
  if (id == input_tokens) return "tokens";
  if (id == input_positions) return "positions";
  if (id == input_out_ids) return "out_ids";
  if (id == input_slots) return "slots";
  if (id == input_kv_table) return "kv_table";
  return nullptr;
}

namespace {

bool is_list_producer(OpKind op) { return op == OpKind::ActiveSet || op == OpKind::ActiveUnion; }

struct NodeChecker {
  const Graph& g;
  const Node& n;
  size_t index;
  const std::vector<uint8_t>& list_written;  // tensor -> written only by ActiveSet / ActiveUnion nodes

  [[noreturn]] void fail(const std::string& why) const {
    throw GraphError("node " + std::to_string(index) + " (" + op_name(n.op) + "): " + why);
  }
  const Tensor& t(int id) const {
    if (id < 0 || id >= static_cast<int>(g.tensors.size())) fail("tensor id out of range");
    return g.tensors[size_t(id)];
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
  void one_of(int id, std::initializer_list<DType> allowed, const char* what) const {
    for (DType a : allowed)
      if (t(id).type == a) return;
    fail(std::string(what) + " '" + t(id).name + "' has unsupported type " + dtype_name(t(id).type));
  }
  // An I32 tensor of row or position ids: a graph input (range-checked by every run) or a constant whose
  // entries are checked here to lie in [0, limit) (limit < 0: any non-negative value).
  void index_source(int id, int64_t limit, const char* what) const {
    const Tensor& x = t(id);
    type(id, DType::I32);
    if (x.storage == Storage::Input) return;
    if (x.storage != Storage::External) fail(std::string(what) + " must be a graph input or a constant");
    const auto* v = static_cast<const int32_t*>(x.data);
    for (int64_t k = 0; v && k < x.rows * x.cols; ++k)
      if (v[k] < 0 || (limit >= 0 && v[k] >= limit))
        fail(std::string(what) + " '" + x.name + "' holds " + std::to_string(v[k]) + ", out of range");
  }
  // A constant that must be a permutation of [0, n).
  void permutation(int id, int64_t n, const char* what) const {
    const Tensor& x = t(id);
    type(id, DType::I32); cols(id, n);
    if (x.storage != Storage::External || x.rows != 1) fail(std::string(what) + " must be a one-row constant");
    const auto* v = static_cast<const int32_t*>(x.data);
    if (!v) return;
    std::vector<uint8_t> seen(size_t(n), 0);
    for (int64_t k = 0; k < n; ++k) {
      if (v[k] < 0 || v[k] >= n || seen[size_t(v[k])]) fail(std::string(what) + " '" + x.name + "' is not a permutation");
      seen[size_t(v[k])] = 1;
    }
  }
  // Active lists (I32 [rows, n + 1]: a count, then ascending ids) are written only by ActiveSet /
  // ActiveUnion, which write valid lists, or are constants checked here; so every list a kernel reads is
  // valid, whatever buffer it lives in (the engine keeps list memory apart from other scratch).
  void list_source(int id, int64_t n) const {
    const Tensor& x = t(id);
    type(id, DType::I32); cols(id, n + 1);
    if (x.storage == Storage::External) {
      const auto* v = static_cast<const int32_t*>(x.data);
      for (int64_t r = 0; v && r < x.rows; ++r) {
        const int32_t* l = v + r * (n + 1);
        if (l[0] < 0 || l[0] > n) fail("active list '" + x.name + "' has a count out of range");
        for (int32_t k = 0; k < l[0]; ++k)
          if (l[1 + k] < 0 || l[1 + k] >= n || (k > 0 && l[1 + k] <= l[k]))
            fail("active list '" + x.name + "' ids must be ascending in [0, " + std::to_string(n) + ")");
      }
      return;
    }
    if (!list_written[size_t(id)]) fail("active list '" + x.name + "' must be written by ActiveSet or ActiveUnion");
  }
};

}  // namespace

void Graph::validate() const {
  const size_t nt = tensors.size();
  const int roles[] = {input_tokens, input_positions, input_out_ids, input_slots, input_kv_table};
  for (int r : roles) {
    if (r < -1 || r >= int(nt)) throw GraphError("a named input's tensor id is out of range");
    if (r >= 0 && (tensors[size_t(r)].storage != Storage::Input || tensors[size_t(r)].type != DType::I32))
      throw GraphError(std::string("the ") + input_role(r) + " input must be an I32 input tensor");
  }
  if (output_logits >= int(nt)) throw GraphError("the logits output's tensor id is out of range");
  for (size_t i = 0; i < nt; ++i)
    if (tensors[i].storage == Storage::Input && !input_role(int(i)))
      throw GraphError("input tensor '" + tensors[i].name + "' is not bound by any named input role");
  // Which tensors only list producers write.
  std::vector<uint8_t> list_written(nt, 0), other_written(nt, 0);
  for (const Node& n : nodes)
    if (n.dst >= 0 && size_t(n.dst) < nt) (is_list_producer(n.op) ? list_written : other_written)[size_t(n.dst)] = 1;
  for (size_t i = 0; i < nt; ++i)
    if (other_written[i]) list_written[i] = 0;

  std::vector<bool> union_written(nt, false);
  int paged_block = 0;
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    NodeChecker c{*this, n, k, list_written};
    const Tensor& d = c.t(n.dst);
    if (d.storage != Storage::Scratch && d.storage != Storage::State)
      c.fail("tensor '" + d.name + "' is a weight or an input; nodes write only scratch or state");
    for (int s : n.src)
      if (s < -1) c.fail("tensor id out of range");
    if (n.when_list >= 0) {  // checked before this node's own result counts (no node guards itself)
      c.t(n.when_list);      // range check
      if (!union_written[size_t(n.when_list)]) c.fail("when_list must be the result of an earlier ActiveUnion node");
    }
    if (n.max_tokens < 0) c.fail("max_tokens must be >= 0");
    if (n.backend < 0) c.fail("backend index must be >= 0");
    switch (n.op) {
      case OpKind::GetRows: {
        const Tensor& table = c.t(n.src[0]);
        c.type(n.dst, DType::F32); c.cols(n.src[0], d.cols);
        if (!dtype_is_integer_dot(table.type)) c.one_of(n.src[0], {DType::F32, DType::F16, DType::BF16}, "table");
        if (table.row_mode != RowMode::Fixed) c.fail("the table must have fixed rows");
        c.index_source(n.src[1], table.rows, "row ids");
        if (!std::isfinite(n.f[0])) c.fail("the row scale must be finite");
        break;
      }
      case OpKind::RmsNorm:
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32); c.type(n.src[1], DType::F32);
        c.cols(n.src[0], d.cols); c.cols(n.src[1], n.i[0] > 0 ? n.i[0] : d.cols);
        if (n.i[0] < 0 || (n.i[0] > 0 && d.cols % n.i[0])) c.fail("the norm segment must divide the columns");
        if (!(n.f[0] >= 0.f && n.f[0] < 1.f)) c.fail("eps must be in [0, 1)");
        break;
      case OpKind::Quantize:
        c.type(n.dst, DType::Q8A); c.type(n.src[0], DType::F32); c.cols(n.src[0], d.cols);
        break;
      case OpKind::MatMul: {
        const Tensor& w = c.t(n.src[0]);
        c.type(n.dst, DType::F32);
        if (!dtype_is_integer_dot(w.type)) c.one_of(n.src[0], {DType::F32, DType::F16, DType::BF16}, "weight");
        if (w.row_mode != RowMode::Fixed) c.fail("the weight must have fixed rows");
        c.cols(n.src[1], w.cols);
        if (d.cols != w.rows) c.fail("dst columns must equal weight rows");
        c.type(n.src[1], dtype_is_integer_dot(w.type) ? DType::Q8A : DType::F32);
        if (n.src[2] >= 0) {  // a list per token, or one list (a union) for every token
          c.list_source(n.src[2], w.rows);
          const Tensor& l = c.t(n.src[2]);
          if (l.row_mode == RowMode::Fixed && l.rows != 1) c.fail("a shared active list has one row");
          if (l.row_mode == RowMode::Outputs) c.fail("active lists have one row per token, or one row");
        }
        break;
      }
      case OpKind::Rope:
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32); c.cols(n.src[0], d.cols);
        c.index_source(n.src[1], -1, "positions");
        if (n.i[0] < 1 || n.i[1] < 2 || int64_t(n.i[0]) * n.i[1] != d.cols || n.i[1] % 2)
          c.fail("heads * head_dim must equal columns, with an even head_dim");
        if (!(n.f[0] > 0.f) || !std::isfinite(n.f[0])) c.fail("the RoPE base must be positive");
        if (n.i[2] != int32_t(RopeMode::Normal) && n.i[2] != int32_t(RopeMode::Neox)) c.fail("unknown RoPE mode");
        break;
      case OpKind::KvStore:
        c.one_of(n.dst, {DType::F16, DType::Q8_0}, "KV cache");
        c.type(n.src[0], DType::F32);
        c.cols(n.src[0], d.cols);
        if (d.storage != Storage::State) c.fail("KV cache must be state");
        c.index_source(n.src[1], d.rows, "KV rows");
        break;
      case OpKind::Attention: {
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32);
        c.one_of(n.src[1], {DType::F16, DType::Q8_0}, "K cache");
        c.one_of(n.src[2], {DType::F16, DType::Q8_0}, "V cache");
        if (n.i[0] < 1 || n.i[1] < 1 || n.i[2] < 1 || n.i[0] % n.i[1]) c.fail("heads must be a multiple of kv heads");
        if ((c.t(n.src[1]).type == DType::Q8_0 || c.t(n.src[2]).type == DType::Q8_0) && n.i[2] % kQuantBlock)
          c.fail("a q8_0 KV cache needs a head_dim that is a multiple of 32");
        if (n.i[4] < 0) c.fail("the sliding window must be >= 0");
        if (!(n.f[0] > 0.f) || !std::isfinite(n.f[0])) c.fail("the attention scale must be positive");
        c.cols(n.src[0], int64_t(n.i[0]) * n.i[2]); c.cols(n.dst, int64_t(n.i[0]) * n.i[2]);
        c.cols(n.src[1], int64_t(n.i[1]) * n.i[2]); c.cols(n.src[2], int64_t(n.i[1]) * n.i[2]);
        const Tensor& kc = c.t(n.src[1]);
        if (kc.storage != Storage::State || c.t(n.src[2]).storage != Storage::State || c.t(n.src[2]).rows != kc.rows)
          c.fail("K and V caches must be state of equal rows");
        c.index_source(n.src[3], kc.rows, "positions");
        if (n.src[4] >= 0) {
          if (n.src[4] != input_kv_table) c.fail("the block table must be the kv_table input");
          if (n.i[3] < 1 || kc.rows % n.i[3]) c.fail("paged attention needs a block size dividing the cache rows");
          if (paged_block && paged_block != n.i[3]) c.fail("every paged attention must use one block size");
          paged_block = n.i[3];
        }
        break;
      }
      case OpKind::Add:
      case OpKind::SiluMul:
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32); c.type(n.src[1], DType::F32);
        c.cols(n.src[0], d.cols); c.cols(n.src[1], d.cols);
        if (n.i[0] < 0 || n.i[0] >= kActivations) c.fail("unknown activation");
        break;
      case OpKind::SelectRows: {
        const Tensor& x = c.t(n.src[0]);
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32);
        c.cols(n.src[0], d.cols);
        // Rows of a per-token source are bounded by the run's token count, checked by every run.
        c.index_source(n.src[1], x.row_mode == RowMode::Fixed ? x.rows : -1, "row ids");
        if (x.row_mode == RowMode::Outputs) c.fail("the source must have fixed or per-token rows");
        break;
      }
      case OpKind::BiasRelu:
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32); c.type(n.src[1], DType::F32);
        c.cols(n.src[0], d.cols); c.cols(n.src[1], d.cols);
        break;
      case OpKind::ActiveSet: {
        c.type(n.dst, DType::I32); c.type(n.src[0], DType::F32); c.cols(n.dst, int64_t(n.i[0]) + 1);
        if (n.i[0] < 1) c.fail("n_ff must be positive");
        if (n.i[1] < 0 || n.i[1] > n.i[0]) c.fail("hot prefix out of range");
        if (n.i[2] == 0) {
          c.cols(n.src[0], int64_t(n.i[0]) - n.i[1]); c.type(n.src[1], DType::F32);
          c.cols(n.src[1], int64_t(n.i[0]) - n.i[1]);
        } else if (n.i[2] == 1) {
          c.cols(n.src[0], n.i[0]);
        } else {
          c.fail("unknown mode");
        }
        if (d.row_mode == RowMode::Fixed) c.fail("active lists have one row per token");
        break;
      }
      case OpKind::GatedAct:
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32); c.type(n.src[1], DType::F32);
        c.cols(n.src[0], d.cols); c.cols(n.src[1], d.cols);
        c.list_source(n.src[2], d.cols);
        if (c.t(n.src[2]).row_mode != RowMode::Tokens) c.fail("gated_act reads one active list per token");
        if (n.i[0] < 0 || n.i[0] >= kActivations) c.fail("unknown activation");
        break;
      case OpKind::DownAxpy: {
        const Tensor& w = c.t(n.src[0]);
        c.type(n.dst, DType::F32); c.type(n.src[1], DType::F32);
        if (w.type != DType::Q8_0 && w.type != DType::Q4_1 && w.type != DType::Q4T && w.type != DType::F32 &&
            w.type != DType::F16)
          c.fail("neuron-major down must be Q4T, Q4_1, Q8_0, F32 or F16");
        if (w.row_mode != RowMode::Fixed || w.storage != Storage::External) c.fail("down must be a weight");
        c.cols(n.src[0], d.cols); c.cols(n.src[1], w.rows);
        c.list_source(n.src[2], w.rows);
        if (c.t(n.src[2]).row_mode != RowMode::Tokens) c.fail("down_axpy reads one active list per token");
        if (w.type == DType::Q4T) {
          c.type(n.src[3], DType::F16); c.cols(n.src[3], 2 * d.cols);
          if (w.rows % kQuantBlock || c.t(n.src[3]).rows != w.rows / kQuantBlock) c.fail("Q4T needs n_ff / 32 scale rows");
        }
        if (n.src[4] >= 0) c.permutation(n.src[4], w.rows, "row map");
        if (n.src[5] >= 0) {
          c.list_source(n.src[5], w.rows);
          if (c.t(n.src[5]).row_mode != RowMode::Fixed || c.t(n.src[5]).rows != 1) c.fail("the union is one row");
        }
        break;
      }
      case OpKind::ScatterCols:
        c.type(n.dst, DType::F32); c.type(n.src[0], DType::F32);
        c.cols(n.src[0], d.cols);
        c.permutation(n.src[1], d.cols, "permutation");
        break;
      case OpKind::ActiveUnion:
        c.type(n.dst, DType::I32);
        c.cols(n.dst, int64_t(n.i[0]) + 1);
        if (n.i[0] < 1) c.fail("n_ff must be positive");
        c.list_source(n.src[0], n.i[0]);
        if (c.t(n.src[0]).row_mode != RowMode::Tokens) c.fail("the union reads one active list per token");
        if (d.row_mode != RowMode::Fixed || d.rows != 1 || d.storage != Storage::State)
          c.fail("the union is one row of state");
        if (n.i[1] < 1) c.fail("the token limit must be at least 1");
        union_written[size_t(n.dst)] = true;
        break;
      case OpKind::NeuronFetch:
        c.type(n.dst, DType::I32);
        if (d.storage != Storage::State) c.fail("the fetch marker is state");
        if (n.i[0] < 0) c.fail("the layer must not be negative");
        if (n.i[1] != 0 && n.i[1] != 1) c.fail("i[1] must be 0 (fetch) or 1 (release)");
        if (n.src[0] >= 0) {
          c.type(n.src[0], DType::I32);
          if (!union_written[size_t(n.src[0])]) c.fail("the fetch list must be the result of an earlier ActiveUnion");
        }
        break;
      default:
        c.fail("unknown op");
    }
  }
}

}  // namespace pyinfer
