// One element of a float weight row (F32, F16 or BF16) as F32: the tails of the vector float-weight kernels
// (matmul_float_x86.h, matmul_neon.cpp), which widen whole vectors otherwise.
#pragma once
#include <cstdint>

#include "graph/dtype.h"
#include "kernels/fp16.h"

namespace pyinfer {

template <DType WT>
inline float float_weight_at(const uint8_t* row, int64_t i) {
  static_assert(WT == DType::F32 || WT == DType::F16 || WT == DType::BF16, "a float weight type");
  if constexpr (WT == DType::F32) return reinterpret_cast<const float*>(row)[i];
  const uint16_t h = reinterpret_cast<const uint16_t*>(row)[i];
  if constexpr (WT == DType::F16) return fp16_to_fp32(h);
  return bf16_to_fp32(h);
}

}  // namespace pyinfer
