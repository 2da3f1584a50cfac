// Row-wise float ops shared by every ISA (small next to the matmuls; the compiler vectorises them).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "graph/dtype.h"
#include "graph/op_params.h"
#include "kernels/fp16.h"
#include "kernels/kernels.h"

namespace pyinfer {


// Shared by the dense and sparse FFN ops so both paths round alike.
inline float silu(float x) { return x / (1.f + std::exp(-x)); }
// |f(g)| > t for f = SiLU or GELU (tanh) as plain comparisons on g: g > hi, or lo < g < mid on f's negative
// lobe (SiLU's minimum is -0.2785 at g = -1.2785, GELU's -0.1700 at g = -0.7525), found by bisection once per
// call instead of an exp or tanh per neuron. The CPU's active sets and the CUDA backend's use the same
// cut-offs. The constructor lives in ops_float.cpp (built without ISA flags).
struct GateCut {
  float hi = 0.f, lo = 0.f, mid = 0.f;
  GateCut(GateFn fn, float t);
  GateCut(float hi_, float lo_, float mid_) : hi(hi_), lo(lo_), mid(mid_) {}  // bounds solved before (gate_cut_bounds)
  bool above(float g) const { return (g > hi) | ((g > lo) & (g < mid)); }
};
// GELU (tanh approximation) of every fp16 value, indexed by its bits: the activation costs a rounding to
// fp16 and a load instead of a tanh (as ggml's GGML_GELU_FP16, so results also track llama.cpp's).
const float* gelu_fp16_table();
inline float gelu_tanh(float x) {
  if (x <= -10.f) return 0.f;  // GELU(x) is 0 or x to float precision out here
  if (x >= 10.f) return x;
  return gelu_fp16_table()[fp32_to_fp16(x)];
}
inline float gated_act(Activation a, float g, float u) {
  switch (a) {
    case Activation::SiLU: return silu(g) * u;
    case Activation::ReLU: return (g > 0.f ? g : 0.f) * u;
    case Activation::GeluTanh: return gelu_tanh(g) * u;
    case Activation::ReLU2: return (g > 0.f ? g * g : 0.f) * u;
    case Activation::DReLU: return (g > 0.f ? g : 0.f) * (u > 0.f ? u : 0.f);
    case Activation::SwigluOai: {  // ggml's swiglu_oai with gpt-oss's alpha 1.702 and limit 7
      const float x = std::fmin(g, 7.f), y = std::fmin(std::fmax(u, -7.f), 7.f);
      return x / (1.f + std::exp(1.702f * -x)) * (y + 1.f);
    }
    case Activation::Sigmoid: return u / (1.f + std::exp(-g));  // ggml's sigmoid, then the product
  }
  return 0.f;
}

void dequantize_row(DType type, const uint8_t* src, float* dst, int64_t n);
void rms_norm_row(const float* x, const float* weight, float* y, int64_t n, float eps);
// factors: F32 [head_dim / 2] frequency divisors or nullptr; freq_scale and attn_factor as RopeParams (1: none).
void rope_row(const float* x, float* y, int32_t pos, int heads, int head_dim, float base, RopeMode mode,
              const float* factors = nullptr, float freq_scale = 1.f, float attn_factor = 1.f, int n_rot = 0,
              const float* yarn = nullptr);  // n_rot 0: all; yarn: {ext_factor, low, high} or null
void add_row(const float* a, const float* b, float* y, int64_t n, float scale = 0.f);  // a + scale * b (0: 1)
void scale_row(float* y, int64_t n, float s);  // y *= s (llama.cpp's mul by a one-value tensor)
// y = cap * tanh(x * (1 / cap)), as llama.cpp's scale, tanh, scale (x and y may alias).
void softcap_row(const float* x, float* y, int64_t n, float cap);
void gated_act_row(Activation a, const float* gate, const float* up, float* y, int64_t n);
// gated_act_row for GELU: the portable entry of KernelTable::gelu_mul.
void gelu_mul_generic(const float* gate, const float* up, float* y, int64_t n);

// SiLU(g) * u = g / (1 + exp(-g)) * u for the dense FFN (KernelTable::silu_mul): exp(-g) = 2^n * p(r), with
// -g clamped to [-87.3, 88.3] (2^n stays a normal float), n = round(-g / ln 2), r = -g - n ln 2 in two fused steps
// (Cody-Waite), p the Taylor polynomial of degree 6 (|r| <= ln 2 / 2: within 2 ulp of exp). Every multiply-add
// is an explicit fused one (std::fma here, vfmadd / vfma in the SIMD tables), so no compiler contraction can make
// two tables differ. The sparse FFN's gated_act keeps silu() (libm): it differs from this by an ulp or two.
constexpr float kSiluClampLo = -87.3f, kSiluClampHi = 88.3f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187045e-06f;
constexpr float kExpC[7] = {1.f, 1.f, 0.5f, 1.f / 6, 1.f / 24, 1.f / 120, 1.f / 720};
inline float silu_mul_one(float g, float u) {
  float x = -g;
  x = x < kSiluClampLo ? kSiluClampLo : (x > kSiluClampHi ? kSiluClampHi : x);
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kExpC[6];
  for (int k = 5; k >= 0; --k) p = std::fma(p, r, kExpC[k]);
  const int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return g / std::fma(p, scale, 1.f) * u;
}
void silu_mul_generic(const float* gate, const float* up, float* y, int64_t n);

}  // namespace pyinfer
