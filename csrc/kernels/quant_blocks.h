// Portable decoding of every quantized weight type into 32-element pieces: the scalar reference that the
// SIMD matmuls, dequantize_row and the tests agree with. Compiled without ISA flags (not inline, so an
// AVX2 translation unit can never lend its copy to the scalar path).
#pragma once
#include <cstdint>

#include "graph/dtype.h"

namespace pyinfer {

// Element j (0..31) of a 32-element piece is  d * scale[j / 16] * q[j] + m  (Q2_K: + m * mins[j / 16]).
struct Piece32 {
  int8_t q[32];
  int32_t scale[2];  // 1 for the legacy types; sub-block scales (Q6_K, Q3_K, Q2_K, IQ2_XS, IQ2_S: one per 16)
  float d;
  float m;           // offset shared by the piece: Q4_1's m, -8d for Q4_0, -dmin * min for Q4_K/Q5_K; Q2_K: -dmin
  int32_t mins[2];   // Q2_K only: the 4-bit mins of the two halves (the offset differs every 16 elements)
};

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
