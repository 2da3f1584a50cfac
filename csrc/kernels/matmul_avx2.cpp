// AVX2 + FMA + F16C kernels. This file alone is compiled with those flags; it is only
// called after select_kernels() has checked the CPU (never -march=native).
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "kernels/attention.h"
#include "kernels/kernels.h"

namespace pyinfer {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 16 packed nibbles -> 32 bytes 0..15, GGML order: low nibbles are elements 0..15, high ones 16..31.
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
  return _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
}

// Sum of u8 x s8 products in 8 int32 lanes, as floats.
inline __m256 dot_u8s8(__m256i u, __m256i s) {
  const __m256i p16 = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

// Per weight type: how a block decodes to bytes, its scale, and its per-block offset (times s).
template <DType WT> struct WeightBlock;
template <> struct WeightBlock<DType::Q4_1> {
  using Block = BlockQ4_1;
  static constexpr bool kSigned = false;
  static __m256i q(const Block& b) { return unpack_nibbles(b.qs); }
  static float d(const Block& b) { return _cvtsh_ss(b.d); }
  static float m(const Block& b) { return _cvtsh_ss(b.m); }
};
template <> struct WeightBlock<DType::Q4_0> {
  using Block = BlockQ4_0;
  static constexpr bool kSigned = false;
  static __m256i q(const Block& b) { return unpack_nibbles(b.qs); }
  static float d(const Block& b) { return _cvtsh_ss(b.d); }
  static float m(const Block& b) { return -8.f * _cvtsh_ss(b.d); }  // d*(q-8) = d*q + (-8d)
};
template <> struct WeightBlock<DType::Q8_0> {
  using Block = BlockQ8_0;
  static constexpr bool kSigned = true;
  static __m256i q(const Block& b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)); }
  static float d(const Block& b) { return _cvtsh_ss(b.d); }
  static float m(const Block&) { return 0.f; }
};

// NR weight rows x NT tokens: each weight block is decoded once and reused NT times.
template <DType WT, int NR, int NT>
inline void tile(const uint8_t* const* wrows, const BlockQ8A* const* xrows, int64_t nb, float (&res)[NR][NT]) {
  using P = WeightBlock<WT>;
  using Block = typename P::Block;
  __m256 acc[NR][NT];
  float off[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) { acc[r][t] = _mm256_setzero_ps(); off[r][t] = 0.f; }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i wq[NR];
    float dw[NR], mw[NR];
    for (int r = 0; r < NR; ++r) {
      const Block& blk = reinterpret_cast<const Block*>(wrows[r])[b];
      wq[r] = P::q(blk);
      dw[r] = P::d(blk);
      mw[r] = P::m(blk);
    }
    for (int t = 0; t < NT; ++t) {
      const BlockQ8A& xb = xrows[t][b];
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
      for (int r = 0; r < NR; ++r) {
        __m256 p;
        if (P::kSigned)  // maddubs wants unsigned x signed: move w's sign onto x
          p = dot_u8s8(_mm256_sign_epi8(wq[r], wq[r]), _mm256_sign_epi8(xq, wq[r]));
        else
          p = dot_u8s8(wq[r], xq);
        acc[r][t] = _mm256_fmadd_ps(p, _mm256_set1_ps(dw[r] * xb.d), acc[r][t]);
        off[r][t] += mw[r] * xb.s;
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) res[r][t] = hsum(acc[r][t]) + off[r][t];
}

template <DType WT, int NR, int NT>
void rows_for_tokens(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0) {
  const int64_t nb = a.k / kQuantBlock;
  const BlockQ8A* xr[NT];
  for (int t = 0; t < NT; ++t)
    xr[t] = reinterpret_cast<const BlockQ8A*>(static_cast<const uint8_t*>(a.x) + (t0 + t) * a.x_row_bytes);
  auto row = [&](int64_t i) -> int64_t { return a.row_ids ? a.row_ids[i] : i; };
  int64_t r = r0;
  for (; r + NR <= r1; r += NR) {
    const uint8_t* wr[NR];
    for (int i = 0; i < NR; ++i) wr[i] = a.w + row(r + i) * a.w_row_bytes;
    float res[NR][NT];
    tile<WT, NR, NT>(wr, xr, nb, res);
    for (int i = 0; i < NR; ++i)
      for (int t = 0; t < NT; ++t) a.dst[(t0 + t) * a.ldd + row(r + i)] = res[i][t];
  }
  for (; r < r1; ++r) {
    const uint8_t* wr[1] = {a.w + row(r) * a.w_row_bytes};
    float res[1][NT];
    tile<WT, 1, NT>(wr, xr, nb, res);
    for (int t = 0; t < NT; ++t) a.dst[(t0 + t) * a.ldd + row(r)] = res[0][t];
  }
}

template <DType WT>
void matmul_typed(const MatMulArgs& a) {
  if (a.n_tok == 1) return rows_for_tokens<WT, 4, 1>(a, a.r0, a.r1, 0);
  // Row chunks outer so a chunk of weights stays in L1 while every token tile passes over it.
  constexpr int64_t kRowChunk = 64;
  for (int64_t c0 = a.r0; c0 < a.r1; c0 += kRowChunk) {
    const int64_t c1 = c0 + kRowChunk < a.r1 ? c0 + kRowChunk : a.r1;
    int64_t t = 0;
    for (; t + 4 <= a.n_tok; t += 4) rows_for_tokens<WT, 2, 4>(a, c0, c1, t);
    switch (a.n_tok - t) {
      case 3: rows_for_tokens<WT, 2, 3>(a, c0, c1, t); break;
      case 2: rows_for_tokens<WT, 2, 2>(a, c0, c1, t); break;
      case 1: rows_for_tokens<WT, 2, 1>(a, c0, c1, t); break;
      default: break;
    }
  }
}

void matmul_avx2(const MatMulArgs& a) {
  switch (a.wtype) {
    case DType::Q4_0: return matmul_typed<DType::Q4_0>(a);
    case DType::Q4_1: return matmul_typed<DType::Q4_1>(a);
    case DType::Q8_0: return matmul_typed<DType::Q8_0>(a);
    default: return matmul_float_weights(a);
  }
}

void quantize_q8a_avx2(const float* x, BlockQ8A* y, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float* xb = x + b * kQuantBlock;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(xb + 8 * j);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float mx = _mm_cvtss_f32(m);
    const float d = mx / 127.f, id = mx > 0.f ? 127.f / mx : 0.f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    __m256i qsum = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      q[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      qsum = _mm256_add_epi32(qsum, q[j]);
    }
    // packs work within 128-bit lanes; the permute restores element order.
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    const __m256i ordered = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), ordered);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(qsum), _mm256_extracti128_si256(qsum, 1));
    s = _mm_hadd_epi32(s, s);
    s = _mm_hadd_epi32(s, s);
    y[b].d = d;
    y[b].s = d * float(_mm_cvtsi128_si32(s));
  }
}

float dot_f16_f32_avx2(const uint16_t* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i))),
                          _mm256_loadu_ps(b + i), acc);
  float s = hsum(acc);
  for (; i < n; ++i) s += _cvtsh_ss(a[i]) * b[i];
  return s;
}

void axpy_f16_f32_avx2(float alpha, const uint16_t* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += alpha * _cvtsh_ss(x[i]);
}

void f32_to_f16_avx2(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

}  // namespace

const KernelTable* kernels_avx2() {
  static const KernelTable table{"avx2", matmul_avx2, quantize_q8a_avx2, dot_f16_f32_avx2,
                                 axpy_f16_f32_avx2, f32_to_f16_avx2, axpy_rows_avx2,
                                 attn_tile_avx2, kv_to_f32_avx2};
  return &table;
}

}  // namespace pyinfer
#else
#include "kernels/kernels.h"
namespace pyinfer {
const KernelTable* kernels_avx2() { return nullptr; }
}  // namespace pyinfer
#endif
