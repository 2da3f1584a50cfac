// Portable decoding of every quantized weight type into 32-element pieces: the scalar reference that the
// SIMD matmuls, dequantize_row and the tests agree with. Compiled without ISA flags (not inline, so an
// AVX2 translation unit can never lend its copy to the scalar path).
#pragma once
#include <cstdint>

#include "graph/dtype.h"
#include "kernels/piece_decode.h"  // Piece32

namespace pyinfer {

// How the piece's numbers combine, per type (every kernel table sums a piece this way):
// sub-scales: scale[0] and scale[1] differ (the integer dot is sc0 * dot(0..15) + sc1 * dot(16..31), times d);
// otherwise scale[0] == scale[1] is folded into the float d * scale. Half mins: Q2_K's offset, m * (mins[0] *
// sum(x 0..15) + mins[1] * sum(x 16..31)) in integers, times the activation's d.
constexpr bool piece_has_sub_scales(DType t) {
  return t == DType::Q6_K || t == DType::Q3_K || t == DType::Q2_K || t == DType::IQ2_XS || t == DType::IQ2_S;
}
constexpr bool piece_has_half_mins(DType t) { return t == DType::Q2_K; }

// Decodes piece b (elements 32b .. 32b+31) of a row of `type`. type must be dtype_is_integer_dot.
void decode_piece(DType type, const uint8_t* row, int64_t b, Piece32& p);

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
void kquant_scale_min(const uint8_t* scales, int j, int& scale, int& min);

}  // namespace pyinfer
