// AVX2 inner loops of the tiled attention (attention.cpp has the tiling and the scalar reference): the
// matrix-product tile (attention_tile_gemm.h) for prefill's blocks, its key-lane form for decode's few rows.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/attention.h"

#include <cstring>
#include "kernels/attention_lanes_avx2.h"
#include "kernels/attention_tile_gemm.h"

namespace pyinfer {

void attn_tile_avx2(const AttnTileArgs& a) {
  if (a.head_dim % 8 || attn_v_dim(a) % 8) return attn_tile_generic(a);
  // keys x row vectors 4 x 2 and rows x value vectors 4 x 2: 8 accumulators each of the 16 registers
  if (a.rows >= kAttnGemmRows || !a.kt) return attn_gemm::tile<Avx2Lanes, 4, 2, 4, 2>(a);
  // one row x 8 key vectors: 8 accumulators
  attn_gemm::key_lane_tile<Avx2Lanes, 1, 4, 2>(a);
}

namespace {
inline void kv_row_to_f32(DType type, const uint8_t* src, float* dst, int64_t n) {
  if (type == DType::F32) {  // an fp32 cache (llama.cpp's -ctk f32): the row as it is
    std::memcpy(dst, src, size_t(n) * sizeof(float));
    return;
  }
  if (type == DType::Q8_0) {
    const auto* blocks = reinterpret_cast<const BlockQ8_0*>(src);
    for (int64_t b = 0; b < n / kQuantBlock; ++b) {
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(blocks[b].d));
      for (int i = 0; i < 4; ++i) {
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blocks[b].qs + 8 * i));
        _mm256_storeu_ps(dst + b * kQuantBlock + 8 * i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
      }
    }
    return;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  for (; i < n; ++i) dst[i] = _cvtsh_ss(h[i]);
}
}  // namespace

void kv_to_f32_avx2(DType type, const uint8_t* src, size_t stride, float* dst, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) kv_row_to_f32(type, src + size_t(r) * stride, dst + r * n, n);
}

}  // namespace pyinfer
#endif
