// AVX2 inner loops of the tiled attention (attention.cpp has the tiling and the scalar reference): the
// matrix-product tile (attention_tile_gemm.h) for prefill's blocks, its key-lane form for decode's few rows.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/attention.h"
#include "kernels/attention_tile_gemm.h"

namespace pyinfer {
namespace {

// exp(x) for 8 lanes: Cephes' range reduction and degree-5 polynomial (about 1 ulp on [-87, 88]).
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.37626f));
  const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// The 8 x 8 block at src (rows `ss` floats apart) transposed into dst (rows `ds` floats apart).
inline void transpose8x8(const float* src, int64_t ss, float* dst, int64_t ds) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ss);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);      // a0 b0 a1 b1 | a4 b4 a5 b5
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);  // a2 b2 a3 b3 | a6 b6 a7 b7
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));      // a0 b0 c0 d0 | a4 ..
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));  // a1 b1 c1 d1 | a5 ..
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ds, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ds, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// 8 float lanes for attention_tile_gemm.h.
struct Avx2Lanes {
  using V = __m256;
  using I = __m256i;
  using M = __m256;
  static constexpr int W = 8;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V exp(V x) { return exp8(x); }
  static I loadi(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static M visible(int j, I lo, I hi) {
    const __m256i jj = _mm256_set1_epi32(j);
    return _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(lo, jj), _mm256_cmpgt_epi32(hi, jj)));
  }
  static V select(M m, V x, V fill) { return _mm256_blendv_ps(fill, x, m); }
  static M below(V x, V y) { return _mm256_cmp_ps(x, y, _CMP_LT_OQ); }
  static void transpose_keys(const float* k, int hd, int n, float* kt) { transpose_keys_avx2(k, hd, n, kt); }
};

}  // namespace

void attn_tile_avx2(const AttnTileArgs& a) {
  if (a.head_dim % 8) return attn_tile_generic(a);
  // keys x row vectors 4 x 2 and rows x value vectors 4 x 2: 8 accumulators each of the 16 registers
  if (a.rows >= kAttnGemmRows || !a.kt) return attn_gemm::tile<Avx2Lanes, 4, 2, 4, 2>(a);
  // one row x 8 key vectors: 8 accumulators
  attn_gemm::key_lane_tile<Avx2Lanes, 1, 4, 2>(a);
}

void transpose_keys_avx2(const float* k, int head_dim, int n_keys, float* kt) {
  for (int j = 0; j < n_keys; j += 8)
    for (int d = 0; d < head_dim; d += 8) transpose8x8(k + int64_t(j) * head_dim + d, head_dim, kt + int64_t(d) * kAttnKeyTile + j, kAttnKeyTile);
}

void kv_to_f32_avx2(DType type, const uint8_t* src, float* dst, int64_t n) {
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

}  // namespace pyinfer
#endif
