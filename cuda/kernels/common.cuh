// Device helpers the kernels share: row addressing by stride, warp reductions and the gated activations
// (csrc/kernels/ops_float.h is the CPU reference of the latter).
#pragma once
#include <cstdint>

#include <cuda_fp16.h>

#include "graph/op_params.h"
#include "kernels/ops.cuh"

namespace pyinfer::cuda {

template <typename T>
__device__ __forceinline__ T* at(const Rows& r, int64_t row) {
  return reinterpret_cast<T*>(r.data + row * r.stride);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float gelu_tanh(float g) {
  // As the CPU's table: GELU of g rounded to fp16 (0 and g far out).
  if (g <= -10.f) return 0.f;
  if (g >= 10.f) return g;
  const float x = __half2float(__float2half_rn(g));
  return 0.5f * x * (1.f + tanhf(0.7978845608028654f * x * (1.f + 0.044715f * x * x)));
}

__device__ __forceinline__ float gated(Activation a, float g, float u) {
  switch (a) {
    case Activation::SiLU: return g / (1.f + expf(-g)) * u;
    case Activation::ReLU: return (g > 0.f ? g : 0.f) * u;
    case Activation::GeluTanh: return gelu_tanh(g) * u;
    case Activation::ReLU2: return (g > 0.f ? g * g : 0.f) * u;
    case Activation::DReLU: return (g > 0.f ? g : 0.f) * (u > 0.f ? u : 0.f);
    case Activation::SwigluOai: {
      const float x = fminf(g, 7.f), y = fminf(fmaxf(u, -7.f), 7.f);
      return x / (1.f + expf(1.702f * -x)) * (y + 1.f);
    }
    case Activation::Sigmoid: return u / (1.f + expf(-g));
  }
  return 0.f;
}

}  // namespace pyinfer::cuda
