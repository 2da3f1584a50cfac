// AVX2 inner loops of the tiled attention (attention.cpp has the tiling and the scalar reference): the
// dot-product tile for decode's few rows, and the matrix-product tile (attention_tile_gemm.h) for prefill.
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

// The four sums of c0..c3, each over its 8 lanes.
inline __m128 hsum4(__m256 c0, __m256 c1, __m256 c2, __m256 c3) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(c0, c1), _mm256_hadd_ps(c2, c3));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Scores of rows r and r+1 (Two) against keys [j0, j1), j0 and j1 multiples of 4.
template <bool Two>
void scores(const AttnTileArgs& a, int64_t r, int j0, int j1, float* s0, float* s1) {
  const int hd = a.head_dim;
  const float* q0 = a.q + r * hd;
  const float* q1 = Two ? q0 + hd : q0;
  for (int j = j0; j < j1; j += 4) {
    const float* k = a.k + int64_t(j) * hd;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00, c13 = c00;
    for (int d = 0; d < hd; d += 8) {
      const __m256 k0 = _mm256_loadu_ps(k + d), k1 = _mm256_loadu_ps(k + hd + d);
      const __m256 k2 = _mm256_loadu_ps(k + 2 * hd + d), k3 = _mm256_loadu_ps(k + 3 * hd + d);
      const __m256 x0 = _mm256_loadu_ps(q0 + d);
      c00 = _mm256_fmadd_ps(x0, k0, c00); c01 = _mm256_fmadd_ps(x0, k1, c01);
      c02 = _mm256_fmadd_ps(x0, k2, c02); c03 = _mm256_fmadd_ps(x0, k3, c03);
      if (Two) {
        const __m256 x1 = _mm256_loadu_ps(q1 + d);
        c10 = _mm256_fmadd_ps(x1, k0, c10); c11 = _mm256_fmadd_ps(x1, k1, c11);
        c12 = _mm256_fmadd_ps(x1, k2, c12); c13 = _mm256_fmadd_ps(x1, k3, c13);
      }
    }
    _mm_storeu_ps(s0 + j, hsum4(c00, c01, c02, c03));
    if (Two) _mm_storeu_ps(s1 + j, hsum4(c10, c11, c12, c13));
  }
}

// Turns row r's scores over [w0, w1) (multiples of 8) into exp(s - m_new), zero outside the row's keys,
// and updates its m and l. Returns the factor its accumulator must be scaled by.
float softmax_row(const AttnTileArgs& a, int64_t r, float* s, int w0, int w1) {
  const int lo = a.lo[r], hi = a.hi[r];
  if (lo >= hi) {
    for (int j = w0; j < w1; j += 8) _mm256_storeu_ps(s + j, _mm256_setzero_ps());
    return 1.f;
  }
  const __m256i vlo = _mm256_set1_epi32(lo - 1), vhi = _mm256_set1_epi32(hi);
  const __m256i step = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  auto in_row = [&](int j) {
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(j), step);
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(idx, vlo), _mm256_cmpgt_epi32(vhi, idx)));
  };
  // Only the vectors that straddle the row's ends need a mask.
  auto inside = [&](int j) { return j >= lo && j + 8 <= hi; };
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 mx = ninf;
  for (int j = w0; j < w1; j += 8) {
    const __m256 x = _mm256_loadu_ps(s + j);
    mx = _mm256_max_ps(mx, inside(j) ? x : _mm256_blendv_ps(ninf, x, in_row(j)));
  }
  const float m_new = std::fmax(a.m[r], hmax(mx));
  const __m256 vm = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int j = w0; j < w1; j += 8) {
    __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
    if (!inside(j)) p = _mm256_and_ps(in_row(j), p);
    _mm256_storeu_ps(s + j, p);
    sum = _mm256_add_ps(sum, p);
  }
  const float alpha = std::exp(a.m[r] - m_new);  // 0 for the first keys (m was -inf)
  a.l[r] = a.l[r] * alpha + hsum(sum);
  a.m[r] = m_new;
  return alpha;
}

// acc[r][d, d + 8 NV) = acc * alpha + sum_j p[j] v[j][d, d + 8 NV) over each row's own keys [lo, hi), for rows
// r and r+1 (Two). Keys both rows see are read once for the pair; a row never touches a key outside its range
// (a masked weight of 0 times an inf value would be NaN).
template <bool Two, int NV>
void accumulate_chunk(const AttnTileArgs& a, int64_t r, int d, const float* p0, const float* p1, float alpha0,
                      float alpha1) {
  const int hd = a.head_dim;
  float* acc0 = a.acc + r * hd + d;
  float* acc1 = Two ? acc0 + hd : acc0;
  const int lo0 = a.lo[r], hi0 = a.hi[r];
  const int lo1 = Two ? a.lo[r + 1] : 0, hi1 = Two ? a.hi[r + 1] : 0;
  const int c0 = std::max(lo0, lo1), c1 = std::min(hi0, hi1);  // keys both rows see (Two)
  __m256 x0[NV], x1[NV];
  for (int i = 0; i < NV; ++i) {
    x0[i] = _mm256_mul_ps(_mm256_loadu_ps(acc0 + 8 * i), _mm256_set1_ps(alpha0));
    x1[i] = Two ? _mm256_mul_ps(_mm256_loadu_ps(acc1 + 8 * i), _mm256_set1_ps(alpha1)) : x0[i];
  }
  auto one = [&](__m256* x, const float* p, int j0, int j1) {
    for (int j = j0; j < j1; ++j) {
      const float* v = a.v + int64_t(j) * hd + d;
      const __m256 w = _mm256_set1_ps(p[j]);
      for (int i = 0; i < NV; ++i) x[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * i), x[i]);
    }
  };
  if (Two && c0 < c1) {
    for (int j = c0; j < c1; ++j) {
      const float* v = a.v + int64_t(j) * hd + d;
      const __m256 w0 = _mm256_set1_ps(p0[j]), w1 = _mm256_set1_ps(p1[j]);
      for (int i = 0; i < NV; ++i) {
        const __m256 vv = _mm256_loadu_ps(v + 8 * i);
        x0[i] = _mm256_fmadd_ps(w0, vv, x0[i]);
        x1[i] = _mm256_fmadd_ps(w1, vv, x1[i]);
      }
    }
    one(x0, p0, lo0, std::min(hi0, c0));
    one(x0, p0, std::max(lo0, c1), hi0);
    one(x1, p1, lo1, std::min(hi1, c0));
    one(x1, p1, std::max(lo1, c1), hi1);
  } else {
    one(x0, p0, lo0, hi0);
    if (Two) one(x1, p1, lo1, hi1);
  }
  for (int i = 0; i < NV; ++i) {
    _mm256_storeu_ps(acc0 + 8 * i, x0[i]);
    if (Two) _mm256_storeu_ps(acc1 + 8 * i, x1[i]);
  }
}

template <bool Two>
void accumulate(const AttnTileArgs& a, int64_t r, const float* p0, const float* p1, float alpha0, float alpha1) {
  int d = 0;
  for (; d + 32 <= a.head_dim; d += 32) accumulate_chunk<Two, 4>(a, r, d, p0, p1, alpha0, alpha1);
  for (; d < a.head_dim; d += 8) accumulate_chunk<Two, 1>(a, r, d, p0, p1, alpha0, alpha1);
}

template <bool Two>
void tile_rows(const AttnTileArgs& a, int64_t r) {
  const bool e0 = a.lo[r] >= a.hi[r], e1 = !Two || a.lo[r + 1] >= a.hi[r + 1];
  if (e0 && e1) return;
  // The keys either row sees; scores are computed in fours, softmax in eights (the tile is padded).
  const int lo = std::min(e0 ? kAttnKeyTile : a.lo[r], e1 ? kAttnKeyTile : a.lo[r + 1]);
  const int hi = std::max(e0 ? 0 : a.hi[r], e1 ? 0 : a.hi[r + 1]);
  const int w0 = lo / 8 * 8, w1 = std::min((hi + 7) / 8 * 8, kAttnKeyTile);
  float* s0 = a.scores;
  float* s1 = a.scores + kAttnKeyTile;
  scores<Two>(a, r, lo / 4 * 4, (hi + 3) / 4 * 4, s0, s1);
  const float alpha0 = softmax_row(a, r, s0, w0, w1);
  const float alpha1 = Two ? softmax_row(a, r + 1, s1, w0, w1) : 0.f;
  accumulate<Two>(a, r, s0, s1, alpha0, alpha1);
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
};

}  // namespace

void attn_tile_avx2(const AttnTileArgs& a) {
  if (a.head_dim % 8) return attn_tile_generic(a);
  // keys x row vectors 4 x 2 and rows x value vectors 4 x 2: 8 accumulators each of the 16 registers
  if (a.rows >= kAttnGemmRows) return attn_gemm::tile<Avx2Lanes, 4, 2, 4, 2>(a);
  int64_t r = 0;
  for (; r + 2 <= a.rows; r += 2) tile_rows<true>(a, r);
  if (r < a.rows) tile_rows<false>(a, r);
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
