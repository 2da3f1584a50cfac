// Packed block scales: the 6-bit scale and min of K-quant sub-block j (0..7) from a Q4_K / Q5_K super-block's 12
// packed bytes, Q3_K's 16 signed scales, MXFP4's exponent; for the CPU (quant_blocks.cpp, the SIMD decoders) and the
// CUDA kernels (cuda/kernels/dequant.cuh) alike. Static: every
// translation unit keeps its own copy, so a SIMD-flagged one never lends its build to the others.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define PYINFER_HOST_DEVICE __host__ __device__
#else
#define PYINFER_HOST_DEVICE
#endif

namespace pyinfer {

// Sub-blocks 0..3 keep 6 bits in bytes 0..7; 4..7 keep their low 4 bits in bytes 8..11 and borrow the top
// 2 bits of bytes 0..7.
static inline PYINFER_HOST_DEVICE void unpack_kquant_scale_min(const uint8_t* s, int j, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q3_K's 16 6-bit scales, minus 32: scale i's low nibble is nibble i / 8 of byte i % 8, its top two bits bits
// 2 (i / 4) of byte 8 + i % 4.
static inline PYINFER_HOST_DEVICE void unpack_q3k_scales(const uint8_t* packed, int8_t* sc) {
  for (int i = 0; i < 16; ++i) {
    const int low = (packed[i % 8] >> (4 * (i / 8))) & 0x0f;
    const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    sc[i] = int8_t((low | high << 4) - 32);
  }
}

// MXFP4's E8M0 exponent as half its power of two, 2^(e - 128) (its value table is doubled); e 0 and 1 are
// subnormal floats.
static inline PYINFER_HOST_DEVICE float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

}  // namespace pyinfer
