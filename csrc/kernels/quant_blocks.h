// Portable decoding of every quantized weight type into 32-element pieces: the scalar reference that the
// SIMD matmuls, dequantize_row and the tests agree with. Compiled without ISA flags (not inline, so an
// AVX2 translation unit can never lend its copy to the scalar path).
#pragma once
#include <cstdint>

#include "graph/dtype.h"

namespace pyinfer {

// Element j (0..31) of a 32-element piece is  d * scale[j / 16] * q[j] + m.
struct Piece32 {
  int8_t q[32];
  int32_t scale[2];  // 1 for the legacy types; K-quant sub-block scales (Q6_K has one per 16)
  float d;
  float m;           // offset shared by the piece: Q4_1's m, -8d for Q4_0, -dmin * min for Q4_K/Q5_K
};

// Decodes piece b (elements 32b .. 32b+31) of a row of `type`. type must be dtype_is_integer_dot.
void decode_piece(DType type, const uint8_t* row, int64_t b, Piece32& p);

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
void kquant_scale_min(const uint8_t* scales, int j, int& scale, int& min);

}  // namespace pyinfer
