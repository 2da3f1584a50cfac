#include "graph/op_params.h"

#include <cstring>

#include "graph/graph.h"

namespace pyinfer {

namespace {

#define PYI_I32(op, field) {#field, false, offsetof(OpParams, op) + offsetof(decltype(OpParams::op), field)}
#define PYI_F32(op, field) {#field, true, offsetof(OpParams, op) + offsetof(decltype(OpParams::op), field)}

constexpr ParamField kGetRows[] = {PYI_F32(get_rows, scale)};
constexpr ParamField kRmsNorm[] = {PYI_F32(rms_norm, eps), PYI_I32(rms_norm, segment)};
constexpr ParamField kRope[] = {PYI_I32(rope, heads), PYI_I32(rope, head_dim), PYI_I32(rope, mode), PYI_F32(rope, base),
                            PYI_F32(rope, freq_scale), PYI_F32(rope, attn_factor), PYI_I32(rope, n_rot),
                            PYI_F32(rope, ext_factor), PYI_F32(rope, yarn_low), PYI_F32(rope, yarn_high)};
constexpr ParamField kAttention[] = {PYI_I32(attention, heads), PYI_I32(attention, kv_heads),
                                 PYI_I32(attention, head_dim), PYI_I32(attention, block_size),
                                 PYI_I32(attention, window), PYI_F32(attention, scale),
                                 PYI_I32(attention, v_dim)};
constexpr ParamField kGatedMul[] = {PYI_I32(gated_mul, act)};
constexpr ParamField kAdd[] = {PYI_F32(add, scale), PYI_F32(add, post)};
constexpr ParamField kSoftcap[] = {PYI_F32(softcap, cap)};
constexpr ParamField kActiveSet[] = {PYI_I32(active_set, n_ff), PYI_I32(active_set, hot), PYI_I32(active_set, mode),
                                 PYI_I32(active_set, gate_fn), PYI_F32(active_set, threshold),
                                 PYI_I32(active_set, top_k)};
constexpr ParamField kGatedAct[] = {PYI_I32(gated_act, act), PYI_F32(gated_act, threshold)};
constexpr ParamField kActiveUnion[] = {PYI_I32(active_union, n_ff), PYI_I32(active_union, max_tokens),
                                   PYI_F32(active_union, max_density), PYI_F32(active_union, max_union),
                                   PYI_F32(active_union, max_single)};
constexpr ParamField kNeuronFetch[] = {PYI_I32(neuron_fetch, layer), PYI_I32(neuron_fetch, mode)};
constexpr ParamField kMoeRoute[] = {PYI_I32(moe_route, n_expert), PYI_I32(moe_route, k), PYI_I32(moe_route, gating),
                                    PYI_I32(moe_route, norm), PYI_F32(moe_route, scale),
                                    PYI_I32(moe_route, n_group), PYI_I32(moe_route, group_used)};
constexpr ParamField kMoe[] = {PYI_I32(moe, n_expert), PYI_I32(moe, k)};
constexpr ParamField kMoeMatMul[] = {PYI_I32(moe, n_expert), PYI_I32(moe, k), PYI_I32(moe, gate_fn)};
constexpr ParamField kQuantize[] = {PYI_I32(quantize, scheme)};
constexpr ParamField kExpertFetch[] = {PYI_I32(expert_fetch, layer), PYI_I32(expert_fetch, prefetch)};
constexpr ParamField kSsmConv[] = {PYI_I32(ssm_conv, silu)};
constexpr ParamField kDeltaNet[] = {PYI_I32(delta_net, k_heads), PYI_I32(delta_net, v_heads),
                                    PYI_I32(delta_net, head_dim), PYI_F32(delta_net, eps),
                                    PYI_I32(delta_net, grouped)};

#undef PYI_I32
#undef PYI_F32

template <size_t N>
constexpr int count(const ParamField (&)[N]) { return int(N); }

// The one op table: indexed by OpKind (checked below), each op's name (in errors, timings and Python's Op
// enum), its source slot names (matching the *Src enums of op_params.h) and its parameters.
constexpr OpSignature kSignatures[] = {
    {OpKind::GetRows, "get_rows", "GET_ROWS", {"table", "ids"}, kGetRows, count(kGetRows)},
    {OpKind::RmsNorm, "rms_norm", "RMS_NORM", {"x", "weight"}, kRmsNorm, count(kRmsNorm)},
    {OpKind::Quantize, "quantize", "QUANTIZE", {"x"}, kQuantize, count(kQuantize)},
    {OpKind::MatMul, "mat_mul", "MAT_MUL", {"weight", "x", "active"}, nullptr, 0},
    {OpKind::Rope, "rope", "ROPE", {"x", "positions", "factors"}, kRope, count(kRope)},
    {OpKind::KvStore, "kv_store", "KV_STORE", {"x", "rows"}, nullptr, 0},
    {OpKind::Attention, "attention", "ATTENTION", {"q", "k_cache", "v_cache", "positions", "table", "sinks", "q_rope"},
     kAttention,
     count(kAttention)},
    {OpKind::Add, "add", "ADD", {"a", "b"}, kAdd, count(kAdd)},
    {OpKind::SiluMul, "silu_mul", "SILU_MUL", {"gate", "up"}, kGatedMul, count(kGatedMul)},
    {OpKind::SelectRows, "select_rows", "SELECT_ROWS", {"x", "rows"}, nullptr, 0},
    {OpKind::BiasRelu, "bias_relu", "BIAS_RELU", {"x", "bias"}, nullptr, 0},
    {OpKind::ActiveSet, "active_set", "ACTIVE_SET", {"scores", "cut"}, kActiveSet, count(kActiveSet)},
    {OpKind::GatedAct, "gated_act", "GATED_ACT", {"gate", "up", "active"}, kGatedAct, count(kGatedAct)},
    {OpKind::DownAxpy, "down_axpy", "DOWN_AXPY", {"down", "act", "active", "scales", "row_map", "union_list"},
     nullptr, 0},
    {OpKind::ScatterCols, "scatter_cols", "SCATTER_COLS", {"x", "perm"}, nullptr, 0},
    {OpKind::ActiveUnion, "active_union", "ACTIVE_UNION", {"lists"}, kActiveUnion, count(kActiveUnion)},
    {OpKind::NeuronFetch, "neuron_fetch", "NEURON_FETCH", {"union_list"}, kNeuronFetch, count(kNeuronFetch)},
    {OpKind::Copy, "copy", "COPY", {"x"}, nullptr, 0},
    {OpKind::MoeRoute, "moe_route", "MOE_ROUTE", {"logits", "bias", "expert_scale"}, kMoeRoute, count(kMoeRoute)},
    {OpKind::MoeMatMul, "moe_mat_mul", "MOE_MAT_MUL", {"weight", "x", "route", "gate", "cut", "bias"}, kMoeMatMul,
     count(kMoeMatMul)},
    {OpKind::MoeCombine, "moe_combine", "MOE_COMBINE", {"experts", "route", "shared", "shared_gate"}, kMoe, count(kMoe)},
    {OpKind::ExpertFetch, "expert_fetch", "EXPERT_FETCH", {"route"}, kExpertFetch, count(kExpertFetch)},
    {OpKind::MoeRouteSplit, "moe_route_split", "MOE_ROUTE_SPLIT", {"route", "map"}, kMoe, count(kMoe)},
    {OpKind::SsmConv, "ssm_conv", "SSM_CONV", {"x", "weight", "state", "positions", "rows"}, kSsmConv, count(kSsmConv)},
    {OpKind::DeltaNet, "delta_net", "DELTA_NET", {"qkv", "beta", "alpha", "decay", "state", "positions", "rows"},
     kDeltaNet, count(kDeltaNet)},
    {OpKind::Softcap, "softcap", "SOFTCAP", {"x"}, kSoftcap, count(kSoftcap)},
};
static_assert(sizeof(kSignatures) / sizeof(kSignatures[0]) == kOpKinds,
              "an op was added or removed: give it a row here, and a case in every backend's compute and supports");

constexpr bool table_in_op_order() {
  for (int k = 0; k < kOpKinds; ++k)
    if (kSignatures[k].op != OpKind(k)) return false;
  return true;
}
static_assert(table_in_op_order(), "kSignatures must list the ops in OpKind order");

}  // namespace

const char* op_name(OpKind op) {
  const int k = int(op);
  return k >= 0 && k < kOpKinds ? kSignatures[k].name : "?";
}

const OpSignature& op_signature(OpKind op) {
  const int k = int(op);
  if (k < 0 || k >= kOpKinds) throw GraphError("unknown op");
  return kSignatures[k];
}

int op_source_slot(OpKind op, const char* name) {
  const OpSignature& s = op_signature(op);
  for (int k = 0; k < kMaxSources; ++k)
    if (s.sources[k] && std::strcmp(s.sources[k], name) == 0) return k;
  return -1;
}

const ParamField* op_param(OpKind op, const char* name) {
  const OpSignature& s = op_signature(op);
  for (int k = 0; k < s.n_params; ++k)
    if (std::strcmp(s.params[k].name, name) == 0) return &s.params[k];
  return nullptr;
}

}  // namespace pyinfer
