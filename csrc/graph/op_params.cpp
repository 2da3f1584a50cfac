#include "graph/op_params.h"

#include <cstring>

#include "graph/graph.h"

namespace pyinfer {

namespace {

#define PYI_I32(op, field) {#field, false, offsetof(OpParams, op) + offsetof(decltype(OpParams::op), field)}
#define PYI_F32(op, field) {#field, true, offsetof(OpParams, op) + offsetof(decltype(OpParams::op), field)}

const ParamField kGetRows[] = {PYI_F32(get_rows, scale)};
const ParamField kRmsNorm[] = {PYI_F32(rms_norm, eps), PYI_I32(rms_norm, segment)};
const ParamField kRope[] = {PYI_I32(rope, heads), PYI_I32(rope, head_dim), PYI_I32(rope, mode), PYI_F32(rope, base),
                            PYI_F32(rope, freq_scale), PYI_F32(rope, attn_factor)};
const ParamField kAttention[] = {PYI_I32(attention, heads), PYI_I32(attention, kv_heads),
                                 PYI_I32(attention, head_dim), PYI_I32(attention, block_size),
                                 PYI_I32(attention, window), PYI_F32(attention, scale)};
const ParamField kGatedMul[] = {PYI_I32(gated_mul, act)};
const ParamField kActiveSet[] = {PYI_I32(active_set, n_ff), PYI_I32(active_set, hot), PYI_I32(active_set, mode),
                                 PYI_I32(active_set, silu), PYI_F32(active_set, threshold)};
const ParamField kGatedAct[] = {PYI_I32(gated_act, act), PYI_F32(gated_act, threshold)};
const ParamField kActiveUnion[] = {PYI_I32(active_union, n_ff), PYI_I32(active_union, max_tokens),
                                   PYI_F32(active_union, max_density), PYI_F32(active_union, max_union),
                                   PYI_F32(active_union, max_single)};
const ParamField kNeuronFetch[] = {PYI_I32(neuron_fetch, layer), PYI_I32(neuron_fetch, mode)};

#undef PYI_I32
#undef PYI_F32

template <size_t N>
constexpr int count(const ParamField (&)[N]) { return int(N); }

// Indexed by OpKind; slot names match the *Src enums of op_params.h.
const OpSignature kSignatures[kOpKinds] = {
    {{"table", "ids"}, kGetRows, count(kGetRows)},
    {{"x", "weight"}, kRmsNorm, count(kRmsNorm)},
    {{"x"}, nullptr, 0},
    {{"weight", "x", "active"}, nullptr, 0},
    {{"x", "positions", "factors"}, kRope, count(kRope)},
    {{"x", "rows"}, nullptr, 0},
    {{"q", "k_cache", "v_cache", "positions", "table"}, kAttention, count(kAttention)},
    {{"a", "b"}, nullptr, 0},
    {{"gate", "up"}, kGatedMul, count(kGatedMul)},
    {{"x", "rows"}, nullptr, 0},
    {{"x", "bias"}, nullptr, 0},
    {{"scores", "cut"}, kActiveSet, count(kActiveSet)},
    {{"gate", "up", "active"}, kGatedAct, count(kGatedAct)},
    {{"down", "act", "active", "scales", "row_map", "union_list"}, nullptr, 0},
    {{"x", "perm"}, nullptr, 0},
    {{"lists"}, kActiveUnion, count(kActiveUnion)},
    {{"union_list"}, kNeuronFetch, count(kNeuronFetch)},
    {{"x"}, nullptr, 0},
};

}  // namespace

const OpSignature& op_signature(OpKind op) {
  const int k = int(op);
  if (k < 0 || k >= kOpKinds) throw GraphError("unknown op");
  return kSignatures[k];
}

int op_source_slot(OpKind op, const char* name) {
  const OpSignature& s = op_signature(op);
  for (int k = 0; k < 6; ++k)
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
