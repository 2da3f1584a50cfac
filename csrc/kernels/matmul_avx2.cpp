// AVX2 + FMA + F16C kernels. This file alone is compiled with those flags; it is only
// called after select_kernels() has checked the CPU (never -march=native).
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "kernels/attention.h"
#include "kernels/kernels.h"
#include "kernels/quant_blocks.h"

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

// 32 bytes whose bit 4 is bit j of the 32-bit mask (the fifth bit of Q5_0 / Q5_1 elements).
inline __m256i fifth_bits(const uint8_t* qh_bytes) {
  uint32_t qh;
  __builtin_memcpy(&qh, qh_bytes, 4);
  // Byte i takes mask byte i / 8, then keeps bit i % 8.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(qh)), _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// Per weight type: piece b (32 elements) of a row as bytes q, 16-bit scales for elements 0..15 and
// 16..31 (all 1 for the legacy types), a float scale d and an offset m multiplied by the activation's s.
// Element j is d * sc[j / 16] * q[j] + m.
struct Piece {
  __m256i q;
  __m256i sc16;
  float d, m;
};

template <DType WT> struct WeightBlock;
template <> struct WeightBlock<DType::Q4_1> {
  static constexpr bool kSigned = false;
  static void load(const uint8_t* row, int64_t b, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ4_1*>(row)[b];
    p.q = unpack_nibbles(blk.qs);
    p.sc16 = _mm256_set1_epi16(1);
    p.d = _cvtsh_ss(blk.d);
    p.m = _cvtsh_ss(blk.m);
  }
};
template <> struct WeightBlock<DType::Q4_0> {
  static constexpr bool kSigned = false;
  static void load(const uint8_t* row, int64_t b, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ4_0*>(row)[b];
    p.q = unpack_nibbles(blk.qs);
    p.sc16 = _mm256_set1_epi16(1);
    p.d = _cvtsh_ss(blk.d);
    p.m = -8.f * p.d;  // d*(q-8) = d*q + (-8d)
  }
};
template <> struct WeightBlock<DType::Q5_0> {
  static constexpr bool kSigned = false;
  static void load(const uint8_t* row, int64_t b, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ5_0*>(row)[b];
    p.q = _mm256_or_si256(unpack_nibbles(blk.qs), fifth_bits(blk.qh));
    p.sc16 = _mm256_set1_epi16(1);
    p.d = _cvtsh_ss(blk.d);
    p.m = -16.f * p.d;
  }
};
template <> struct WeightBlock<DType::Q5_1> {
  static constexpr bool kSigned = false;
  static void load(const uint8_t* row, int64_t b, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ5_1*>(row)[b];
    p.q = _mm256_or_si256(unpack_nibbles(blk.qs), fifth_bits(blk.qh));
    p.sc16 = _mm256_set1_epi16(1);
    p.d = _cvtsh_ss(blk.d);
    p.m = _cvtsh_ss(blk.m);
  }
};
template <> struct WeightBlock<DType::Q8_0> {
  static constexpr bool kSigned = true;
  static void load(const uint8_t* row, int64_t b, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ8_0*>(row)[b];
    p.q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs));
    p.sc16 = _mm256_set1_epi16(1);
    p.d = _cvtsh_ss(blk.d);
    p.m = 0.f;
  }
};
// Q4_K and Q5_K: sub-block j = b % 8 of super-block b / 8.
template <DType WT> struct KQuantBlock {
  static constexpr bool kSigned = false;
  static void load(const uint8_t* row, int64_t b, Piece& p) {
    constexpr bool kFive = WT == DType::Q5_K;
    const int64_t sb = b / 8;
    const int j = int(b % 8);
    const uint8_t* base = row + sb * (kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K));
    const auto& k4 = *reinterpret_cast<const BlockQ4_K*>(base);  // d, dmin and scales share offsets
    const uint8_t* qs = kFive ? reinterpret_cast<const BlockQ5_K*>(base)->qs : k4.qs;
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (j / 2)));
    p.q = _mm256_and_si256((j & 1) ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(0x0f));
    if (kFive) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const BlockQ5_K*>(base)->qh));
      const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), _mm256_set1_epi8(1));
      p.q = _mm256_or_si256(p.q, _mm256_slli_epi16(hi, 4));
    }
    int sc, mn;
    kquant_scale_min(k4.scales, j, sc, mn);
    p.sc16 = _mm256_set1_epi16(int16_t(sc));
    p.d = _cvtsh_ss(k4.d);
    p.m = -_cvtsh_ss(k4.dmin) * float(mn);
  }
};
template <> struct WeightBlock<DType::Q4_K> : KQuantBlock<DType::Q4_K> {};
template <> struct WeightBlock<DType::Q5_K> : KQuantBlock<DType::Q5_K> {};
template <> struct WeightBlock<DType::Q6_K> {
  static constexpr bool kSigned = true;
  static void load(const uint8_t* row, int64_t b, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ6_K*>(row)[b / 8];
    const int j = int(b % 8), half = j / 4, g = j % 4;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.ql + 64 * half + 32 * (g & 1)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * half));
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128((g >> 1) * 4)), _mm256_set1_epi8(0x0f));
    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
    p.q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
    const int16_t s0 = blk.scales[8 * half + 2 * g], s1 = blk.scales[8 * half + 2 * g + 1];
    p.sc16 = _mm256_setr_m128i(_mm_set1_epi16(s0), _mm_set1_epi16(s1));
    p.d = _cvtsh_ss(blk.d);
    p.m = 0.f;
  }
};

// NR weight rows x NT tokens: each weight piece is decoded once and reused NT times.
template <DType WT, int NR, int NT>
inline void tile(const uint8_t* const* wrows, const BlockQ8A* const* xrows, int64_t nb, float (&res)[NR][NT]) {
  using P = WeightBlock<WT>;
  __m256 acc[NR][NT];
  float off[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) { acc[r][t] = _mm256_setzero_ps(); off[r][t] = 0.f; }
  for (int64_t b = 0; b < nb; ++b) {
    Piece w[NR];
    for (int r = 0; r < NR; ++r) P::load(wrows[r], b, w[r]);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8A& xb = xrows[t][b];
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
      for (int r = 0; r < NR; ++r) {
        // maddubs wants unsigned x signed: for signed weights move w's sign onto x. Pairs of products
        // fit int16 (|q| <= 32 or q <= 31 against |x| <= 127; Q8_0 is also within range of maddubs'
        // saturation for llama.cpp-style blocks), then madd applies the per-16 scales in int32.
        const __m256i p16 = P::kSigned ? _mm256_maddubs_epi16(_mm256_sign_epi8(w[r].q, w[r].q), _mm256_sign_epi8(xq, w[r].q))
                                       : _mm256_maddubs_epi16(w[r].q, xq);
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, w[r].sc16));
        acc[r][t] = _mm256_fmadd_ps(p, _mm256_set1_ps(w[r].d * xb.d), acc[r][t]);
        off[r][t] += w[r].m * xb.s;
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
    case DType::Q5_0: return matmul_typed<DType::Q5_0>(a);
    case DType::Q5_1: return matmul_typed<DType::Q5_1>(a);
    case DType::Q4_K: return matmul_typed<DType::Q4_K>(a);
    case DType::Q5_K: return matmul_typed<DType::Q5_K>(a);
    case DType::Q6_K: return matmul_typed<DType::Q6_K>(a);
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
