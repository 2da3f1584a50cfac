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
// The low-bit types of MoE quants (NEON has piece decoders for them; AMX runs them through its fallback).
inline constexpr DType kLowBitTypes[] = {DType::Q2_K, DType::Q3_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4,
                                         DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S};

template <typename Scale>
std::vector<uint8_t> random_rows(DType wt, int rows, int64_t k, std::mt19937& rng, Scale scale) {
  const size_t rb = dtype_row_bytes(wt, k);
  const int64_t nb = k / dtype_block_elems(wt);
  const size_t bb = rb / size_t(nb);
  std::vector<int> scale_at = {0};  // byte offsets of the block's fp16 scale fields
  if (wt == DType::Q4_1 || wt == DType::Q5_1 || wt == DType::Q4_K || wt == DType::Q5_K) scale_at = {0, 2};
  if (wt == DType::Q6_K) scale_at = {208};
  if (wt == DType::Q2_K) scale_at = {80, 82};
  if (wt == DType::Q3_K) scale_at = {108};
  if (wt == DType::MXFP4) scale_at = {};  // an exponent byte, set below
  std::vector<uint8_t> w(size_t(rows) * rb);
  for (auto& b : w) b = uint8_t(rng() & 0xff);
  for (int r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b)
      for (int off : scale_at) {
        const uint16_t d = fp32_to_fp16(scale(r));
        std::memcpy(&w[r * rb + b * bb + off], &d, 2);
      }
  if (wt == DType::MXFP4)  // 2^(e - 128) near the rows' scale: 120 .. 123, and the subnormal 0 and 1 now and then
    for (int r = 0; r < rows; ++r)
      for (int64_t b = 0; b < nb; ++b) w[r * rb + b * bb] = uint8_t(b % 7 == 3 ? b % 2 : 120 + rng() % 4);
  return w;
}

}  // namespace pyinfer
