// The 6-bit scale and min of K-quant sub-block j (0..7) from a Q4_K / Q5_K super-block's 12 packed bytes,
// for the CPU (quant_blocks.cpp) and the CUDA kernels (cuda/kernels/dequant.cuh) alike. Static: every
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

}  // namespace pyinfer
