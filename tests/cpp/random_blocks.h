// Random weight rows of the integer-dot types for the C++ kernel tests (neon_vs_scalar.cpp,
// amx_emulated.cpp): every packed bit random, then each block's fp16 scale fields set to scale(row), so that
// every nibble, high bit, 6-bit sub-scale and sign a real file can hold is exercised with products in range.
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "graph/dtype.h"
#include "kernels/fp16.h"

namespace pyinfer {

inline constexpr DType kIntegerDotTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                             DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

template <typename Scale>
std::vector<uint8_t> random_rows(DType wt, int rows, int64_t k, std::mt19937& rng, Scale scale) {
  const size_t rb = dtype_row_bytes(wt, k);
  const int64_t nb = k / dtype_block_elems(wt);
  const size_t bb = rb / size_t(nb);
  std::vector<int> scale_at = {0};  // byte offsets of the block's fp16 scale fields
  if (wt == DType::Q4_1 || wt == DType::Q5_1 || wt == DType::Q4_K || wt == DType::Q5_K) scale_at = {0, 2};
  if (wt == DType::Q6_K) scale_at = {208};
  std::vector<uint8_t> w(size_t(rows) * rb);
  for (auto& b : w) b = uint8_t(rng() & 0xff);
  for (int r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b)
      for (int off : scale_at) {
        const uint16_t d = fp32_to_fp16(scale(r));
        std::memcpy(&w[r * rb + b * bb + off], &d, 2);
      }
  return w;
}

}  // namespace pyinfer
