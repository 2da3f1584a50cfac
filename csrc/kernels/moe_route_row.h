// One token's route from its router logits (MoeRoute; graph.h): the top k experts, earlier experts first among
// equals and NaN last, then softmax over every logit (in double) or sigmoid of the chosen, renormalized and
// scaled. Shared by the CPU backend (backends/cpu/moe_ops.cpp) and the CUDA kernel (cuda/kernels/moe.cu), so the
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

// l: F32 [n_expert] logits; out: F32 [2k], the k weights best first, then the k ids as floats.
PYINFER_HOST_DEVICE inline void moe_route_row(const float* l, float* out, const MoeRouteParams& P) {
  float* w = out;
  float* ids = out + P.k;
  int32_t chosen = 0;
  for (int32_t e = 0; e < P.n_expert; ++e) {
    const float v = moe_finite_or_lowest(l[e]);
    if (chosen == P.k && v <= w[P.k - 1]) continue;
    int32_t pos = chosen < P.k ? chosen++ : P.k - 1;
    while (pos > 0 && w[pos - 1] < v) {  // softmax and sigmoid are increasing: the top k logits are the top k
      w[pos] = w[pos - 1];
      ids[pos] = ids[pos - 1];
      --pos;
    }
    w[pos] = v;
    ids[pos] = float(e);
  }
  const float top = w[0];
  if (!std::isfinite(top)) {  // no usable logit (NaN or infinite everywhere): equal weights, not NaN
    for (int32_t s = 0; s < P.k; ++s) w[s] = 1.f / float(P.k);
    return;
  }
  if (P.gating == MoeGating::Softmax) {
    double sum = 0;
    for (int32_t e = 0; e < P.n_expert; ++e) sum += std::exp(double(moe_finite_or_lowest(l[e])) - double(top));
    for (int32_t s = 0; s < P.k; ++s) w[s] = float(std::exp(double(w[s]) - double(top)) / sum);
  } else {
    for (int32_t s = 0; s < P.k; ++s) w[s] = 1.f / (1.f + std::exp(-w[s]));
  }
  if (P.norm) {  // llama.cpp clamps the sum at the smallest normal fp16 before dividing
    float sum = 0;
    for (int32_t s = 0; s < P.k; ++s) sum += w[s];
    sum = sum > 6.103515625e-5f ? sum : 6.103515625e-5f;
    for (int32_t s = 0; s < P.k; ++s) w[s] /= sum;
  }
  if (P.scale != 0.f && P.scale != 1.f)
    for (int32_t s = 0; s < P.k; ++s) w[s] *= P.scale;
}

}  // namespace pyinfer
