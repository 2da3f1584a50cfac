// Graph::validate(): every check a graph passes before an engine is built from it (ids in range, each op's
// sources, shapes, types and parameters, list producers and readers, views inside their bases), so that a
// kernel never sees a shape it was not written for. Bad graphs are one GraphError line, never a crash.
#include <cmath>
#include <initializer_list>
#include <vector>

#include "graph/graph.h"

namespace pyinfer {

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
    type(id, DType::I32);
    const Tensor& x = t(g.origin(id));
    if (x.storage == Storage::Input) return;
    if (x.storage != Storage::External) fail(std::string(what) + " must be a graph input or a constant");
    const auto* v = static_cast<const int32_t*>(x.data);
    for (int64_t k = 0; v && k < x.rows * x.cols; ++k)
      if (v[k] < 0 || (limit >= 0 && v[k] >= limit))
        fail(std::string(what) + " '" + x.name + "' holds " + std::to_string(v[k]) + ", out of range");
  }
  // A recurrent op's state (fixed rows of F32 state, `want` values each, one per sequence), its positions and
  // its optional per-token state rows (an input's rows are checked by the kernel as it reads them).
  void recurrent_state(int state, int64_t want, int positions, int rows) const {
    type(state, DType::F32);
    const Tensor& s = t(state);
    if (s.storage != Storage::State || s.view_of >= 0 || s.row_mode != RowMode::Fixed || s.rows < 1)
      fail("the recurrent state '" + s.name + "' must be state of its own with fixed rows");
    cols(state, want);
    index_source(positions, -1, "positions");
    if (rows >= 0) index_source(rows, s.rows, "state rows");
  }
  // A constant that must be a permutation of [0, n).
  void permutation(int id, int64_t n, const char* what) const {
    type(id, DType::I32); cols(id, n);
    const Tensor& x = t(g.origin(id));
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
    type(id, DType::I32); cols(id, n + 1);
    id = g.origin(id);
    const Tensor& x = t(id);
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
  const int roles[] = {input_tokens, input_positions, input_out_ids, input_slots, input_kv_table, input_state_rows};
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
  std::vector<int> route_k(nt, 0);  // tensor -> k of the MoeRoute node that wrote it (expert ids come only from there)
  std::vector<int> route_n(nt, 0);  // ... and the experts it chose among
  std::vector<uint8_t> route_split(nt, 0);  // ... 1: one backend's share (MoeRouteSplit: ids -1 are another's)
  int paged_block = 0;
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    NodeChecker c{*this, n, k, list_written};
    const Tensor& d = c.t(n.dst);
    if (d.storage != Storage::Scratch && d.storage != Storage::State)
      c.fail("tensor '" + d.name + "' is a weight or an input; nodes write only scratch or state");
    for (int s : n.src) {
      if (s < -1) c.fail("tensor id out of range");
      // An expert store's table holds one pointer per expert: only the expert matmul reads it so.
      if (s >= 0 && c.t(s).paged && (c.t(s).experts > 0) != (n.op == OpKind::MoeMatMul && s == n.src[MoeMatMulSrc::weight]))
        c.fail("tensor '" + c.t(s).name + "' is paged by " + (c.t(s).experts > 0 ? "expert" : "row") +
               " and cannot be read by this op");
    }
    const bool moe_op = n.op == OpKind::MoeRoute || n.op == OpKind::MoeMatMul || n.op == OpKind::MoeCombine ||
                        n.op == OpKind::ExpertFetch || n.op == OpKind::MoeRouteSplit;
    if (moe_op && (n.guard.run_if != RunIf::Always || n.guard.max_tokens || n.guard.min_tokens || n.guard.when_list >= 0))
      c.fail("Mixture-of-Experts nodes run in every run (a skipped route would leave its readers stale ids)");
    if (n.guard.when_list >= 0) {  // checked before this node's own result counts (no node guards itself)
      c.t(n.guard.when_list);      // range check
      if (!union_written[size_t(origin(n.guard.when_list))])
        c.fail("when_list must be the result of an earlier ActiveUnion node");
    }
    if (n.guard.max_tokens < 0) c.fail("max_tokens must be >= 0");
    if (n.guard.min_tokens < 0) c.fail("min_tokens must be >= 0");
    if (n.guard.min_tokens > 0 && n.guard.max_tokens > 0 && n.guard.min_tokens > n.guard.max_tokens)
      c.fail("min_tokens above max_tokens: the node could never run");
    const auto& src = n.src;
    switch (n.op) {
      case OpKind::GetRows: {
        using S = GetRowsSrc;
        const Tensor& table = c.t(src[S::table]);
        c.type(n.dst, DType::F32); c.cols(src[S::table], d.cols);
        if (!dtype_is_integer_dot(table.type)) c.one_of(src[S::table], {DType::F32, DType::F16, DType::BF16}, "table");
        if (table.row_mode != RowMode::Fixed) c.fail("the table must have fixed rows");
        c.index_source(src[S::ids], table.rows, "row ids");
        if (!std::isfinite(n.p.get_rows.scale)) c.fail("the row scale must be finite");
        break;
      }
      case OpKind::RmsNorm: {
        using S = RmsNormSrc;
        const auto& P = n.p.rms_norm;
        c.type(n.dst, DType::F32); c.type(src[S::x], DType::F32); c.type(src[S::weight], DType::F32);
        c.cols(src[S::x], d.cols); c.cols(src[S::weight], P.segment > 0 ? P.segment : d.cols);
        if (P.segment < 0 || (P.segment > 0 && d.cols % P.segment)) c.fail("the norm segment must divide the columns");
        if (!(P.eps >= 0.f && P.eps < 1.f)) c.fail("eps must be in [0, 1)");
        break;
      }
      case OpKind::Quantize:
        c.type(n.dst, DType::Q8A); c.type(src[QuantizeSrc::x], DType::F32); c.cols(src[QuantizeSrc::x], d.cols);
        if (n.p.quantize.scheme < 0 || n.p.quantize.scheme > int32_t(ActScheme::Q8_K)) c.fail("unknown quantize scheme");
        break;
      case OpKind::MatMul: {
        using S = MatMulSrc;
        const Tensor& w = c.t(src[S::weight]);
        c.type(n.dst, DType::F32);
        if (!dtype_is_integer_dot(w.type)) c.one_of(src[S::weight], {DType::F32, DType::F16, DType::BF16}, "weight");
        if (w.row_mode != RowMode::Fixed) c.fail("the weight must have fixed rows");
        c.cols(src[S::x], w.cols);
        if (d.cols != w.rows) c.fail("dst columns must equal weight rows");
        c.type(src[S::x], dtype_is_integer_dot(w.type) ? DType::Q8A : DType::F32);
        if (src[S::active] >= 0) {  // a list per token, or one list (a union) for every token
          c.list_source(src[S::active], w.rows);
          const Tensor& l = c.t(src[S::active]);
          if (l.row_mode == RowMode::Fixed && l.rows != 1) c.fail("a shared active list has one row");
          if (l.row_mode == RowMode::Outputs) c.fail("active lists have one row per token, or one row");
        }
        break;
      }
      case OpKind::Rope: {
        const auto& P = n.p.rope;
        c.type(n.dst, DType::F32); c.type(src[RopeSrc::x], DType::F32); c.cols(src[RopeSrc::x], d.cols);
        c.index_source(src[RopeSrc::positions], -1, "positions");
        if (P.heads < 1 || P.head_dim < 2 || int64_t(P.heads) * P.head_dim != d.cols || P.head_dim % 2)
          c.fail("heads * head_dim must equal columns, with an even head_dim");
        if (!(P.base > 0.f) || !std::isfinite(P.base)) c.fail("the RoPE base must be positive");
        if (P.mode != RopeMode::Normal && P.mode != RopeMode::Neox) c.fail("unknown RoPE mode");
        if (P.n_rot < 0 || P.n_rot > P.head_dim || P.n_rot % 2) c.fail("n_rot must be even and in [0, head_dim]");
        if (!std::isfinite(P.ext_factor) || !std::isfinite(P.yarn_low) || !std::isfinite(P.yarn_high) ||
            (P.ext_factor != 0.f && !(P.freq_scale > 0.f)))
          c.fail("YaRN needs finite parameters and a positive freq_scale");
        if (!std::isfinite(P.freq_scale) || P.freq_scale < 0.f || !std::isfinite(P.attn_factor) || P.attn_factor < 0.f)
          c.fail("RoPE freq_scale and attn_factor must be finite and >= 0 (0: 1)");
        if (src[RopeSrc::factors] >= 0) {
          const Tensor& f = c.t(src[RopeSrc::factors]);
          c.type(src[RopeSrc::factors], DType::F32);
          if (f.row_mode != RowMode::Fixed || f.rows != 1 || f.cols != (P.n_rot ? P.n_rot : P.head_dim) / 2)
            c.fail("RoPE factors must be one fixed row of n_rot / 2 values");
        }
        break;
      }
      case OpKind::KvStore:
        c.one_of(n.dst, {DType::F16, DType::Q8_0, DType::F32}, "KV cache");
        c.type(src[KvStoreSrc::x], DType::F32);
        c.cols(src[KvStoreSrc::x], d.cols);
        if (c.t(origin(n.dst)).storage != Storage::State) c.fail("KV cache must be state");
        c.index_source(src[KvStoreSrc::rows], d.rows, "KV rows");
        break;
      case OpKind::Attention: {
        using S = AttentionSrc;
        const auto& P = n.p.attention;
        c.type(n.dst, DType::F32); c.type(src[S::q], DType::F32);
        c.one_of(src[S::k_cache], {DType::F16, DType::Q8_0, DType::F32}, "K cache");
        c.one_of(src[S::v_cache], {DType::F16, DType::Q8_0, DType::F32}, "V cache");
        if (P.heads < 1 || P.kv_heads < 1 || P.head_dim < 1 || P.heads % P.kv_heads)
          c.fail("heads must be a multiple of kv heads");
        if ((c.t(src[S::k_cache]).type == DType::Q8_0 || c.t(src[S::v_cache]).type == DType::Q8_0) &&
            P.head_dim % kQuantBlock)
          c.fail("a q8_0 KV cache needs a head_dim that is a multiple of 32");
        if (P.window < 0) c.fail("the sliding window must be >= 0");
        if (!(P.scale > 0.f) || !std::isfinite(P.scale)) c.fail("the attention scale must be positive");
        if (src[S::sinks] >= 0) {
          const Tensor& s = c.t(src[S::sinks]);
          c.type(src[S::sinks], DType::F32);
          if (s.row_mode != RowMode::Fixed || s.rows != 1 || s.cols != P.heads)
            c.fail("attention sinks must be one fixed row of one value per head");
        }
        const int32_t v_dim = P.v_dim ? P.v_dim : P.head_dim;
        if (v_dim < 1 || v_dim > P.head_dim) c.fail("v_dim must be in [1, head_dim]");
        if (c.t(src[S::v_cache]).type == DType::Q8_0 && v_dim % kQuantBlock)
          c.fail("a q8_0 V cache needs a v_dim that is a multiple of 32");
        int64_t rope_w = 0;  // MLA: each query head's rotary part, from q_rope
        if (src[S::q_rope] >= 0) {
          c.type(src[S::q_rope], DType::F32);
          rope_w = c.t(src[S::q_rope]).cols / P.heads;
          if (rope_w < 1 || rope_w >= P.head_dim || c.t(src[S::q_rope]).cols != P.heads * rope_w)
            c.fail("q_rope must hold heads equal parts, each shorter than head_dim");
        }
        c.cols(src[S::q], int64_t(P.heads) * (P.head_dim - rope_w)); c.cols(n.dst, int64_t(P.heads) * v_dim);
        c.cols(src[S::k_cache], int64_t(P.kv_heads) * P.head_dim);
        c.cols(src[S::v_cache], int64_t(P.kv_heads) * v_dim);
        const Tensor& kc = c.t(src[S::k_cache]);
        const Tensor& vc = c.t(src[S::v_cache]);
        if (c.t(origin(src[S::k_cache])).storage != Storage::State ||
            c.t(origin(src[S::v_cache])).storage != Storage::State || vc.rows != kc.rows)
          c.fail("K and V caches must be state of equal rows");
        c.index_source(src[S::positions], kc.rows, "positions");
        if (src[S::table] >= 0) {
          if (origin(src[S::table]) != input_kv_table) c.fail("the block table must be the kv_table input");
          if (P.block_size < 1 || kc.rows % P.block_size) c.fail("paged attention needs a block size dividing the cache rows");
          if (paged_block && paged_block != P.block_size) c.fail("every paged attention must use one block size");
          paged_block = P.block_size;
        }
        break;
      }
      case OpKind::Add:
      case OpKind::SiluMul:  // the same slots: (a, b) and (gate, up)
        c.type(n.dst, DType::F32); c.type(src[0], DType::F32); c.type(src[1], DType::F32);
        c.cols(src[0], d.cols); c.cols(src[1], d.cols);
        if (n.op == OpKind::SiluMul && (int32_t(n.p.gated_mul.act) < 0 || int32_t(n.p.gated_mul.act) >= kActivations))
          c.fail("unknown activation");
        if (n.op == OpKind::Add && !std::isfinite(n.p.add.post)) c.fail("the output scale must be finite");
        break;
      case OpKind::Softcap:
        c.type(n.dst, DType::F32); c.type(src[SoftcapSrc::x], DType::F32); c.cols(src[SoftcapSrc::x], d.cols);
        if (!(n.p.softcap.cap > 0.f) || !std::isfinite(n.p.softcap.cap)) c.fail("the soft cap must be positive");
        break;
      case OpKind::SelectRows: {
        const Tensor& x = c.t(src[SelectRowsSrc::x]);
        c.type(n.dst, DType::F32); c.type(src[SelectRowsSrc::x], DType::F32);
        c.cols(src[SelectRowsSrc::x], d.cols);
        // Rows of a per-token source are bounded by the run's token count, checked by every run.
        c.index_source(src[SelectRowsSrc::rows], x.row_mode == RowMode::Fixed ? x.rows : -1, "row ids");
        if (x.row_mode == RowMode::Outputs) c.fail("the source must have fixed or per-token rows");
        break;
      }
      case OpKind::BiasRelu:
        c.type(n.dst, DType::F32); c.type(src[BiasReluSrc::x], DType::F32); c.type(src[BiasReluSrc::bias], DType::F32);
        c.cols(src[BiasReluSrc::x], d.cols); c.cols(src[BiasReluSrc::bias], d.cols);
        break;
      case OpKind::ActiveSet: {
        using S = ActiveSetSrc;
        const auto& P = n.p.active_set;
        c.type(n.dst, DType::I32); c.type(src[S::scores], DType::F32); c.cols(n.dst, int64_t(P.n_ff) + 1);
        if (P.n_ff < 1) c.fail("n_ff must be positive");
        if (P.hot < 0 || P.hot > P.n_ff) c.fail("hot prefix out of range");
        if (P.top_k < 0 || P.top_k > P.n_ff) c.fail("top_k out of range");
        if (P.top_k > 0 && (P.mode != ActiveSetMode::Threshold || P.gate_fn != GateFn::Identity))
          c.fail("top_k keeps the largest |scores|: threshold mode without a gate function");
        if (P.mode == ActiveSetMode::Predictor) {
          c.cols(src[S::scores], int64_t(P.n_ff) - P.hot); c.type(src[S::cut], DType::F32);
          c.cols(src[S::cut], int64_t(P.n_ff) - P.hot);
        } else if (P.mode == ActiveSetMode::Threshold) {
          c.cols(src[S::scores], P.n_ff);
          if (int32_t(P.gate_fn) < 0 || int32_t(P.gate_fn) > int32_t(GateFn::GeluTanh)) c.fail("unknown gate function");
        } else {
          c.fail("unknown mode");
        }
        if (d.row_mode == RowMode::Fixed) c.fail("active lists have one row per token");
        break;
      }
      case OpKind::GatedAct: {
        using S = GatedActSrc;
        c.type(n.dst, DType::F32); c.type(src[S::gate], DType::F32); c.type(src[S::up], DType::F32);
        c.cols(src[S::gate], d.cols); c.cols(src[S::up], d.cols);
        c.list_source(src[S::active], d.cols);
        if (c.t(src[S::active]).row_mode != RowMode::Tokens) c.fail("gated_act reads one active list per token");
        if (int32_t(n.p.gated_act.act) < 0 || int32_t(n.p.gated_act.act) >= kActivations) c.fail("unknown activation");
        break;
      }
      case OpKind::DownAxpy: {
        using S = DownAxpySrc;
        const Tensor& w = c.t(src[S::down]);
        c.type(n.dst, DType::F32); c.type(src[S::act], DType::F32);
        if (w.type != DType::Q8_0 && w.type != DType::Q4_1 && w.type != DType::Q4T &&
            w.type != DType::F32 && w.type != DType::F16)
          c.fail("neuron-major down must be Q4T, Q4_1, Q8_0, F32 or F16");
        if (w.row_mode != RowMode::Fixed || c.t(origin(src[S::down])).storage != Storage::External)
          c.fail("down must be a weight");
        c.cols(src[S::down], d.cols); c.cols(src[S::act], w.rows);
        c.list_source(src[S::active], w.rows);
        if (c.t(src[S::active]).row_mode != RowMode::Tokens) c.fail("down_axpy reads one active list per token");
        if (w.type == DType::Q4T) {
          c.type(src[S::scales], DType::F16); c.cols(src[S::scales], 2 * d.cols);
          if (c.t(src[S::scales]).row_stride != c.t(src[S::scales]).row_bytes) c.fail("the Q4T scales must be packed");
          if (w.rows % kQuantBlock || c.t(src[S::scales]).rows != w.rows / kQuantBlock)
            c.fail("Q4T needs n_ff / 32 scale rows");
        }
        if (src[S::row_map] >= 0) c.permutation(src[S::row_map], w.rows, "row map");
        if (src[S::union_list] >= 0) {
          c.list_source(src[S::union_list], w.rows);
          if (c.t(src[S::union_list]).row_mode != RowMode::Fixed || c.t(src[S::union_list]).rows != 1)
            c.fail("the union is one row");
        }
        break;
      }
      case OpKind::ScatterCols:
        c.type(n.dst, DType::F32); c.type(src[ScatterColsSrc::x], DType::F32);
        c.cols(src[ScatterColsSrc::x], d.cols);
        c.permutation(src[ScatterColsSrc::perm], d.cols, "permutation");
        break;
      case OpKind::ActiveUnion: {
        const auto& P = n.p.active_union;
        const int lists = src[ActiveUnionSrc::lists];
        c.type(n.dst, DType::I32);
        c.cols(n.dst, int64_t(P.n_ff) + 1);
        if (P.n_ff < 1) c.fail("n_ff must be positive");
        c.list_source(lists, P.n_ff);
        if (c.t(lists).row_mode != RowMode::Tokens) c.fail("the union reads one active list per token");
        if (d.row_mode != RowMode::Fixed || d.rows != 1 || d.storage != Storage::State)
          c.fail("the union is one row of state");
        if (P.max_tokens < 1) c.fail("the token limit must be at least 1");
        union_written[size_t(n.dst)] = true;
        break;
      }
      case OpKind::NeuronFetch: {
        const auto& P = n.p.neuron_fetch;
        const int u = src[NeuronFetchSrc::union_list];
        c.type(n.dst, DType::I32);
        if (d.storage != Storage::State) c.fail("the fetch marker is state");
        if (P.layer < 0) c.fail("the layer must not be negative");
        if (P.mode != NeuronFetchMode::Rows && P.mode != NeuronFetchMode::Release && P.mode != NeuronFetchMode::DenseDown)
          c.fail("mode must be 0 (rows), 1 (release) or 2 (dense down)");
        if (u >= 0) {
          c.type(u, DType::I32);
          if (!union_written[size_t(origin(u))]) c.fail("the fetch list must be the result of an earlier ActiveUnion");
        }
        break;
      }
      case OpKind::Copy: {
        const Tensor& x = c.t(src[CopySrc::x]);
        c.type(n.dst, x.type); c.cols(n.dst, x.cols);
        if (d.row_mode != x.row_mode || (x.row_mode == RowMode::Fixed && d.rows < x.rows))
          c.fail("a copy has the rows of its source");
        if (d.view_of >= 0 || x.paged) c.fail("copies go from a tensor's bytes into a packed tensor of their own");
        break;
      }
      case OpKind::MoeRoute: {
        const auto& P = n.p.moe_route;
        c.type(n.dst, DType::F32); c.type(src[MoeRouteSrc::logits], DType::F32);
        if (P.n_expert < 1 || P.k < 1 || P.k > P.n_expert) c.fail("k must be in [1, n_expert]");
        c.cols(src[MoeRouteSrc::logits], P.n_expert); c.cols(n.dst, 2 * int64_t(P.k));
        if (P.gating != MoeGating::Softmax && P.gating != MoeGating::Sigmoid && P.gating != MoeGating::SoftmaxWeight)
          c.fail("gating must be 0 (softmax), 1 (sigmoid) or 2 (softmax of the chosen)");
        if (P.norm != 0 && P.norm != 1) c.fail("norm must be 0 or 1");
        if (!std::isfinite(P.scale)) c.fail("the weight scale must be finite");
        if (P.n_group > 1) {
          if (P.n_group > kMoeMaxGroups || P.n_expert % P.n_group)
            c.fail("expert groups must split n_expert evenly, at most " + std::to_string(kMoeMaxGroups) + " of them");
          if (P.group_used < 1 || P.group_used > P.n_group || P.k > P.group_used * (P.n_expert / P.n_group))
            c.fail("group_used must be in [1, n_group] and its groups must hold k experts");
          if (P.gating == MoeGating::SoftmaxWeight) c.fail("grouped routing scores groups by probability");
        } else if (P.n_group < 0 || P.group_used < 0) {
          c.fail("n_group and group_used must be >= 0");
        }
        if (src[MoeRouteSrc::bias] >= 0) {
          const Tensor& b = c.t(src[MoeRouteSrc::bias]);
          c.type(src[MoeRouteSrc::bias], DType::F32);
          if (b.row_mode != RowMode::Fixed || b.rows != 1 || b.cols != P.n_expert)
            c.fail("the routing bias must be one fixed row of n_expert values");
          if (P.gating == MoeGating::SoftmaxWeight) c.fail("a routing bias chooses by probability: softmax or sigmoid");
        }
        if (src[MoeRouteSrc::expert_scale] >= 0) {
          const Tensor& s = c.t(src[MoeRouteSrc::expert_scale]);
          c.type(src[MoeRouteSrc::expert_scale], DType::F32);
          if (s.row_mode != RowMode::Fixed || s.rows != 1 || s.cols != P.n_expert)
            c.fail("the experts' output scales must be one fixed row of n_expert values");
        }
        if (d.row_mode != RowMode::Tokens || d.view_of >= 0) c.fail("a route has one row of its own per token");
        break;
      }
      case OpKind::MoeMatMul: {
        using S = MoeMatMulSrc;
        const auto& P = n.p.moe;
        const Tensor& w = c.t(src[S::weight]);
        c.type(n.dst, DType::F32);
        if (!dtype_is_integer_dot(w.type)) c.one_of(src[S::weight], {DType::F32, DType::F16, DType::BF16}, "experts");
        if (w.row_mode != RowMode::Fixed) c.fail("the experts must be a weight of fixed rows");
        if (w.paged && w.experts != P.n_expert) c.fail("the expert store's layer has a different expert count");
        if (d.row_mode != RowMode::Tokens) c.fail("the expert matmul writes one row per token");
        const bool routed = src[S::route] >= 0;  // else every token runs every expert, slot s on expert s
        if (routed) c.t(src[S::route]);  // range check
        // A backend's share of a route may hold fewer experts than a token chooses (its other slots are -1).
        const bool share = routed && route_split[size_t(origin(src[S::route]))] != 0;
        if (P.n_expert < 1 || P.k < 1 || (!share && P.k > P.n_expert) || w.rows % P.n_expert)
          c.fail("the experts' rows must split into n_expert equal matrices, k in [1, n_expert]");
        c.type(src[S::x], dtype_is_integer_dot(w.type) ? DType::Q8A : DType::F32);
        const int64_t xc = c.t(src[S::x]).cols;
        if (xc != w.cols && xc != P.k * w.cols) c.fail("x must have the experts' columns, or k segments of them");
        c.cols(n.dst, P.k * (w.rows / P.n_expert));
        if (!routed) {
          if (P.k != P.n_expert) c.fail("without a route every expert runs: k must be n_expert");
          if (src[S::gate] >= 0 || src[S::bias] >= 0 || w.paged) c.fail("without a route: no gate, cut, bias or store");
        } else {
          if (c.t(src[S::route]).cols != 2 * int64_t(P.k) || route_k[size_t(origin(src[S::route]))] != P.k)
            c.fail("the route must be an earlier MoeRoute's result of the same k");
          if (route_n[size_t(origin(src[S::route]))] != P.n_expert)
            c.fail("the route chose among a different number of experts");
          if (c.t(src[S::route]).row_mode != RowMode::Tokens) c.fail("a route has one row per token");
        }
        if ((src[S::gate] >= 0) != (src[S::cut] >= 0)) c.fail("gate and cut come together (CATS inside the experts)");
        if (src[S::bias] >= 0) {
          const Tensor& b = c.t(src[S::bias]);
          c.type(src[S::bias], DType::F32);
          if (b.row_mode != RowMode::Fixed || b.rows != P.n_expert || b.cols != w.rows / P.n_expert)
            c.fail("expert biases must be F32 [n_expert, expert rows]");
          if (src[S::gate] >= 0) c.fail("expert biases and cuts inside the experts do not go together");
        }
        if (src[S::gate] >= 0) {
          c.type(src[S::gate], DType::F32);
          c.cols(src[S::gate], P.k * (w.rows / P.n_expert));
          if (c.g.origin(src[S::gate]) == c.g.origin(n.dst)) c.fail("the gate must be a tensor other than the output");
          if (xc != w.cols) c.fail("a gate-cut expert matmul reads one input for every slot (up)");
          const Tensor& cut = c.t(src[S::cut]);
          c.type(src[S::cut], DType::F32);
          if (cut.row_mode != RowMode::Fixed || cut.cols != 3 || cut.rows != P.n_expert)
            c.fail("cut must be F32 [n_expert, 3]: each expert's gate bounds");
          if (P.gate_fn != GateFn::SiLU && P.gate_fn != GateFn::GeluTanh && P.gate_fn != GateFn::ReLU)
            c.fail("gate_fn must be 1 (SiLU), 2 (GELU) or 3 (ReLU)");
        }
        break;
      }
      case OpKind::MoeCombine: {
        using S = MoeCombineSrc;
        const auto& P = n.p.moe;
        c.type(n.dst, DType::F32); c.type(src[S::experts], DType::F32);
        if (P.k < 1) c.fail("k must be positive");
        c.cols(src[S::experts], P.k * d.cols);
        if (c.t(src[S::route]).cols != 2 * int64_t(P.k) || route_k[size_t(origin(src[S::route]))] != P.k) c.fail("the route must be an earlier MoeRoute's result of the same k");
        if ((src[S::shared] >= 0) != (src[S::shared_gate] >= 0)) c.fail("a shared expert needs its output and its gate");
        if (src[S::shared] >= 0) {
          c.type(src[S::shared], DType::F32); c.cols(src[S::shared], d.cols);
          c.type(src[S::shared_gate], DType::F32); c.cols(src[S::shared_gate], 1);
        }
        break;
      }
      case OpKind::ExpertFetch:
        c.type(n.dst, DType::I32);
        if (d.storage != Storage::State) c.fail("the fetch marker is state");
        if (n.p.expert_fetch.layer < 0) c.fail("the layer must not be negative");
        if (n.p.expert_fetch.prefetch != 0 && n.p.expert_fetch.prefetch != 1) c.fail("prefetch is 0 or 1");
        c.t(src[ExpertFetchSrc::route]);  // range check
        if (route_k[size_t(origin(src[ExpertFetchSrc::route]))] < 1)
          c.fail("the route must be an earlier MoeRoute's result");
        if (route_split[size_t(origin(src[ExpertFetchSrc::route]))])
          c.fail("a fetch reads a whole route, not one backend's share of it");
        break;
      case OpKind::MoeRouteSplit: {
        using S = MoeRouteSplitSrc;
        const auto& P = n.p.moe;
        c.type(n.dst, DType::F32); c.type(src[S::route], DType::F32); c.type(src[S::map], DType::I32);
        if (P.n_expert < 1 || P.k < 1) c.fail("n_expert and k must be positive");
        c.t(src[S::route]);  // range check
        const int origin_route = origin(src[S::route]);
        if (c.t(src[S::route]).cols != 2 * int64_t(P.k) || route_k[size_t(origin_route)] != P.k)
          c.fail("the route must be an earlier MoeRoute's result of the same k");
        if (route_split[size_t(origin_route)]) c.fail("a route is split once, from the whole route");
        if (c.t(src[S::map]).rows != 1 || c.t(src[S::map]).cols != route_n[size_t(origin_route)])
          c.fail("the map is one row, an entry per expert of the route");  // its entries are checked as read
        c.cols(n.dst, 2 * int64_t(P.k));
        if (d.row_mode != RowMode::Tokens || d.view_of >= 0) c.fail("a route has one row of its own per token");
        break;
      }
      case OpKind::SsmConv: {
        using S = SsmConvSrc;
        c.type(n.dst, DType::F32); c.type(src[S::x], DType::F32); c.type(src[S::weight], DType::F32);
        const Tensor& w = c.t(src[S::weight]);
        c.cols(src[S::x], d.cols);
        if (w.row_mode != RowMode::Fixed || w.rows != d.cols || w.cols < 2)
          c.fail("the conv weight must be fixed rows, one per channel, of at least 2 taps");
        c.recurrent_state(src[S::state], d.cols * (w.cols - 1), src[S::positions], src[S::rows]);
        if (n.p.ssm_conv.silu != 0 && n.p.ssm_conv.silu != 1) c.fail("silu must be 0 or 1");
        if (origin(n.dst) == origin(src[S::x])) c.fail("the conv cannot write its own input");
        break;
      }
      case OpKind::DeltaNet: {
        using S = DeltaNetSrc;
        const auto& P = n.p.delta_net;
        if (P.k_heads < 1 || P.v_heads < 1 || P.head_dim < 1 || P.v_heads % P.k_heads)
          c.fail("v_heads must be a positive multiple of k_heads");
        if (!(P.eps >= 0.f) || !std::isfinite(P.eps)) c.fail("eps must be finite and >= 0");
        if (P.grouped != 0 && P.grouped != 1) c.fail("grouped must be 0 or 1");
        const int64_t s_dim = P.head_dim, hv = P.v_heads;
        c.type(n.dst, DType::F32); c.cols(n.dst, hv * s_dim);
        for (int k : {S::qkv, S::beta, S::alpha, S::decay}) c.type(src[k], DType::F32);
        c.cols(src[S::qkv], (2 * int64_t(P.k_heads) + hv) * s_dim);
        c.cols(src[S::beta], hv); c.cols(src[S::alpha], hv);
        const Tensor& decay = c.t(src[S::decay]);
        if (decay.row_mode != RowMode::Fixed || decay.rows != 2 || decay.cols != hv)
          c.fail("decay must be two fixed rows (dt bias, A) of one value per v head");
        c.recurrent_state(src[S::state], hv * s_dim * s_dim, src[S::positions], src[S::rows]);
        for (int k : {S::qkv, S::beta, S::alpha})
          if (origin(n.dst) == origin(src[k])) c.fail("the delta rule cannot write its own input");
        break;
      }
      default:
        c.fail("unknown op");
    }
    if (n.op == OpKind::MoeRoute) {
      route_k[size_t(n.dst)] = n.p.moe_route.k;
      route_n[size_t(n.dst)] = n.p.moe_route.n_expert;
      route_split[size_t(n.dst)] = 0;
    } else if (n.op == OpKind::MoeRouteSplit) {
      route_k[size_t(n.dst)] = n.p.moe.k;
      route_n[size_t(n.dst)] = n.p.moe.n_expert;
      route_split[size_t(n.dst)] = 1;
    } else if (n.op == OpKind::Copy && route_k[size_t(origin(n.src[CopySrc::x]))]) {  // a route carried across
      route_k[size_t(n.dst)] = route_k[size_t(origin(n.src[CopySrc::x]))];
      route_n[size_t(n.dst)] = route_n[size_t(origin(n.src[CopySrc::x]))];
      route_split[size_t(n.dst)] = route_split[size_t(origin(n.src[CopySrc::x]))];
    } else if (n.dst >= 0) {
      route_k[size_t(origin(n.dst))] = route_n[size_t(origin(n.dst))] = 0;  // rewritten by another op: no route
      route_split[size_t(origin(n.dst))] = 0;
    }
  }
}

}  // namespace pyinfer
