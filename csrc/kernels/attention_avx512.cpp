// AVX-512 tiled attention: the matrix-product tile (attention_tile_gemm.h) on 16 lanes, for prefill's blocks and
// (keys in the lanes) decode's few rows; head sizes that are not a multiple of 16 take the AVX2 tiles.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "kernels/attention.h"
#include "kernels/attention_lanes_avx2.h"
#include "kernels/attention_tile_gemm.h"

namespace pyinfer {
namespace {

// exp(x) for 16 lanes: the AVX2 file's exp8 (Cephes' range reduction and degree-5 polynomial) on 512 bits.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.37626f));
  const __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                         _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

struct Avx512Lanes {
  using V = __m512;
  using I = __m512i;
  using M = __mmask16;
  static constexpr int W = 16;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V exp(V x) { return exp16(x); }
  static I loadi(const int32_t* p) { return _mm512_loadu_si512(p); }
  static M visible(int j, I lo, I hi) {
    const __m512i jj = _mm512_set1_epi32(j);
    return _mm512_cmple_epi32_mask(lo, jj) & _mm512_cmpgt_epi32_mask(hi, jj);
  }
  static V select(M m, V x, V fill) { return _mm512_mask_blend_ps(m, fill, x); }
  static M below(V x, V y) { return _mm512_cmp_ps_mask(x, y, _CMP_LT_OQ); }
};

// The 16 x 16 block at src (rows `ss` floats apart) transposed into dst (rows `ds` floats apart): 64 shuffles
// for 256 floats, where four 8 x 8 blocks take 96.
inline void transpose16x16(const float* src, int64_t ss, float* dst, int64_t ds) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ss);
  for (int i = 0; i < 16; i += 2) {  // pairs of rows interleaved within 128-bit lanes
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // quads of rows: each 128-bit lane holds one column of four rows
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
  }
  // r[4q + c] lane L holds column 4L + c of rows 4q .. 4q + 3; gather the four lanes L of each column.
  for (int c = 0; c < 4; ++c) {
    const __m512 a = _mm512_shuffle_f32x4(r[c], r[4 + c], _MM_SHUFFLE(2, 0, 2, 0));       // L0 L2 of rows 0-7
    const __m512 b = _mm512_shuffle_f32x4(r[c], r[4 + c], _MM_SHUFFLE(3, 1, 3, 1));       // L1 L3
    const __m512 e = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], _MM_SHUFFLE(2, 0, 2, 0));  // rows 8-15
    const __m512 f = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], _MM_SHUFFLE(3, 1, 3, 1));
    _mm512_storeu_ps(dst + (c) * ds, _mm512_shuffle_f32x4(a, e, _MM_SHUFFLE(2, 0, 2, 0)));       // L0
    _mm512_storeu_ps(dst + (4 + c) * ds, _mm512_shuffle_f32x4(b, f, _MM_SHUFFLE(2, 0, 2, 0)));   // L1
    _mm512_storeu_ps(dst + (8 + c) * ds, _mm512_shuffle_f32x4(a, e, _MM_SHUFFLE(3, 1, 3, 1)));   // L2
    _mm512_storeu_ps(dst + (12 + c) * ds, _mm512_shuffle_f32x4(b, f, _MM_SHUFFLE(3, 1, 3, 1)));  // L3
  }
}

// Decode's key-lane tile on AVX2's lanes (faster here than 16: fewer idle lanes past the last key, and the
// same exp lane for lane as exp16, so still the prefill tile's bits), its keys transposed 16 x 16.
struct Avx2LanesT16 : Avx2Lanes {
  static void transpose_keys(const float* k, int hd, int n, float* kt) {  // n and hd multiples of 16
    for (int j = 0; j < n; j += 16)
      for (int d = 0; d < hd; d += 16) transpose16x16(k + int64_t(j) * hd + d, hd, kt + int64_t(d) * kAttnKeyTile + j, kAttnKeyTile);
  }
};

}  // namespace

void attn_tile_avx512(const AttnTileArgs& a) {
  if (a.head_dim % 16 || attn_v_dim(a) % 16) return attn_tile_avx2(a);
  // keys x row vectors 4 x 4 and rows x value vectors 4 x 4: 16 accumulators each of the 32 registers
  if (a.rows >= kAttnGemmRows || !a.kt) return attn_gemm::tile<Avx512Lanes, 4, 4, 4, 4>(a);
  attn_gemm::key_lane_tile<Avx2LanesT16, 1, 4, 2>(a);
}

}  // namespace pyinfer
#endif
