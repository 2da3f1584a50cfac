// One token's route from its router logits (MoeRoute; graph.h): the top k experts, earlier experts first among
// equals and NaN last, then softmax over every logit (in double) or sigmoid of the chosen, renormalized and
// scaled. With a selection bias (GLM-4.5, DeepSeek-V3) the experts are chosen by probability plus bias and
// weighted by the probability alone. Shared by the CPU backend (backends/cpu/moe_ops.cpp) and the CUDA kernel (cuda/kernels/moe.cu), so the
// two route alike by construction.
#pragma once
#include <cmath>
#include <cstdint>

#include "graph/op_params.h"

#if defined(__CUDACC__)
#define PYINFER_HOST_DEVICE __host__ __device__
#else
#define PYINFER_HOST_DEVICE
#endif

namespace pyinfer {

PYINFER_HOST_DEVICE inline float moe_finite_or_lowest(float v) { return std::isnan(v) ? -INFINITY : v; }

// The k largest of v(e) over the experts into w (best first, earlier experts first among equals) and their ids.
template <typename Value>
PYINFER_HOST_DEVICE inline void moe_top_k(int32_t n_expert, int32_t k, Value v_of, float* w, float* ids) {
  int32_t chosen = 0;
  for (int32_t e = 0; e < n_expert; ++e) {
    const float v = moe_finite_or_lowest(v_of(e));
    if (chosen == k && v <= w[k - 1]) continue;
    int32_t pos = chosen < k ? chosen++ : k - 1;
    while (pos > 0 && w[pos - 1] < v) {
      w[pos] = w[pos - 1];
      ids[pos] = ids[pos - 1];
      --pos;
    }
    w[pos] = v;
    ids[pos] = float(e);
  }
}

// l: F32 [n_expert] logits; out: F32 [2k], the k weights best first, then the k ids as floats. bias and
// expert_scale: F32 [n_expert] or null.
PYINFER_HOST_DEVICE inline void moe_route_row(const float* l, float* out, const MoeRouteParams& P,
                                              const float* bias = nullptr, const float* expert_scale = nullptr) {
  float* w = out;
  float* ids = out + P.k;
  const bool grouped = P.n_group > 1;
  float top = -INFINITY;
  if (grouped) {  // the groups are scored by probability: the largest logit first, for softmax's denominator
    for (int32_t e = 0; e < P.n_expert; ++e) top = fmaxf(top, moe_finite_or_lowest(l[e]));
  } else {  // softmax and sigmoid are increasing: without a bias the top k logits are the top k probabilities
    moe_top_k(P.n_expert, P.k, [&](int32_t e) { return l[e]; }, w, ids);
    top = w[0];
  }
  if (!std::isfinite(top)) {  // no usable logit (NaN or infinite everywhere): equal weights, not NaN
    if (grouped) moe_top_k(P.n_expert, P.k, [&](int32_t e) { return l[e]; }, w, ids);  // ids the plain way
    for (int32_t s = 0; s < P.k; ++s) w[s] = expert_scale ? expert_scale[int32_t(ids[s])] / float(P.k) : 1.f / float(P.k);
    return;
  }
  double sum = 0;  // softmax's denominator over every logit (SoftmaxWeight: over the chosen k only)
  if (P.gating == MoeGating::Softmax)
    for (int32_t e = 0; e < P.n_expert; ++e) sum += std::exp(double(moe_finite_or_lowest(l[e])) - double(top));
  if (P.gating == MoeGating::SoftmaxWeight)
    for (int32_t s = 0; s < P.k; ++s) sum += std::exp(double(w[s]) - double(top));
  auto prob = [&](float logit) {
    return P.gating != MoeGating::Sigmoid ? float(std::exp(double(logit) - double(top)) / sum)
                                          : 1.f / (1.f + std::exp(-logit));
  };
  auto selection = [&](int32_t e) { return prob(moe_finite_or_lowest(l[e])) + (bias ? bias[e] : 0.f); };
  if (grouped) {  // DeepSeek-V3: only the experts of the group_used groups whose two best selections sum highest
    const int32_t per = P.n_expert / P.n_group;
    float score[kMoeMaxGroups], kept[kMoeMaxGroups], order[kMoeMaxGroups], best[2], where[2];
    for (int32_t g = 0; g < P.n_group; ++g) {
      const int32_t two = per < 2 ? per : 2;
      moe_top_k(per, two, [&](int32_t j) { return selection(g * per + j); }, best, where);
      score[g] = two == 2 ? best[0] + best[1] : best[0];
    }
    moe_top_k(P.n_group, P.group_used, [&](int32_t g) { return score[g]; }, kept, order);
    uint64_t chosen = 0;
    for (int32_t i = 0; i < P.group_used; ++i) chosen |= uint64_t(1) << int32_t(order[i]);
    moe_top_k(P.n_expert, P.k, [&](int32_t e) { return (chosen >> (e / per)) & 1 ? selection(e) : -INFINITY; }, w, ids);
    for (int32_t s = 0; s < P.k; ++s) w[s] = std::isfinite(w[s]) ? prob(moe_finite_or_lowest(l[int32_t(ids[s])])) : 0.f;
  } else if (bias) {  // chosen by probability + bias, weighted by the probability
    moe_top_k(P.n_expert, P.k, [&](int32_t e) { return selection(e); }, w, ids);
    for (int32_t s = 0; s < P.k; ++s) w[s] = std::isfinite(w[s]) ? prob(moe_finite_or_lowest(l[int32_t(ids[s])])) : 0.f;
  } else {
    for (int32_t s = 0; s < P.k; ++s) w[s] = prob(w[s]);
  }
  if (P.norm) {  // llama.cpp clamps the sum at the smallest normal fp16 before dividing
    float sum = 0;
    for (int32_t s = 0; s < P.k; ++s) sum += w[s];
    sum = sum > 6.103515625e-5f ? sum : 6.103515625e-5f;
    for (int32_t s = 0; s < P.k; ++s) w[s] /= sum;
  }
  if (P.scale != 0.f && P.scale != 1.f)
    for (int32_t s = 0; s < P.k; ++s) w[s] *= P.scale;
  if (expert_scale)
    for (int32_t s = 0; s < P.k; ++s) w[s] *= expert_scale[int32_t(ids[s])];
}

}  // namespace pyinfer
