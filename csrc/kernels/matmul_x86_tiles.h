// The x86 integer-dot matmul tiles, shared by the AVX2 and the AVX-512 VNNI kernel tables. Each of those
// translation units includes this header with its own ISA flags; everything is in an anonymous namespace,
// so the two instantiations never meet at link time.
#pragma once
#include <immintrin.h>

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

// Per weight type: piece b (32 elements) of a row as bytes q, a float scale d and an offset m multiplied by
// the activation's s: element j is d * q[j] + m. Q6_K (kSubScales) also has 16-bit scales sc16 for
// elements 0..15 and 16..31: element j is d * sc[j / 16] * q[j].
struct Piece {
  __m256i q;
  __m256i sc16;  // only for kSubScales types
  float d, m;
};

template <DType WT> struct WeightBlock;
template <> struct WeightBlock<DType::Q4_1> {
  static constexpr bool kSigned = false;
  static constexpr bool kSubScales = false;
  static void load(const uint8_t* row, int64_t b, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ4_1*>(row)[b];
    p.q = unpack_nibbles(blk.qs);
    p.d = _cvtsh_ss(blk.d);
    p.m = _cvtsh_ss(blk.m);
  }
};
template <> struct WeightBlock<DType::Q4_0> {
  static constexpr bool kSigned = false;
  static constexpr bool kSubScales = false;
  static void load(const uint8_t* row, int64_t b, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ4_0*>(row)[b];
    p.q = unpack_nibbles(blk.qs);
    p.d = _cvtsh_ss(blk.d);
    p.m = -8.f * p.d;  // d*(q-8) = d*q + (-8d)
  }
};
template <> struct WeightBlock<DType::Q5_0> {
  static constexpr bool kSigned = false;
  static constexpr bool kSubScales = false;
  static void load(const uint8_t* row, int64_t b, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ5_0*>(row)[b];
    p.q = _mm256_or_si256(unpack_nibbles(blk.qs), fifth_bits(blk.qh));
    p.d = _cvtsh_ss(blk.d);
    p.m = -16.f * p.d;
  }
};
template <> struct WeightBlock<DType::Q5_1> {
  static constexpr bool kSigned = false;
  static constexpr bool kSubScales = false;
  static void load(const uint8_t* row, int64_t b, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ5_1*>(row)[b];
    p.q = _mm256_or_si256(unpack_nibbles(blk.qs), fifth_bits(blk.qh));
    p.d = _cvtsh_ss(blk.d);
    p.m = _cvtsh_ss(blk.m);
  }
};
template <> struct WeightBlock<DType::Q8_0> {
  static constexpr bool kSigned = true;
  static constexpr bool kSubScales = false;
  static void load(const uint8_t* row, int64_t b, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ8_0*>(row)[b];
    p.q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs));
    p.d = _cvtsh_ss(blk.d);
    p.m = 0.f;
  }
};
// Q4_K and Q5_K: sub-block j = b % 8 of super-block b / 8.
template <DType WT> struct KQuantBlock {
  static constexpr bool kSigned = false;
  static constexpr bool kSubScales = false;
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
    p.d = _cvtsh_ss(k4.d) * float(sc);  // one scale for the whole piece
    p.m = -_cvtsh_ss(k4.dmin) * float(mn);
  }
};
template <> struct WeightBlock<DType::Q4_K> : KQuantBlock<DType::Q4_K> {};
template <> struct WeightBlock<DType::Q5_K> : KQuantBlock<DType::Q5_K> {};
template <> struct WeightBlock<DType::Q6_K> {
  static constexpr bool kSigned = true;
  static constexpr bool kSubScales = true;
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

// Integer dot of a piece with 32 activation bytes, as 8 int32 partial sums. Unsigned x signed is what
// the instructions take: signed weights move their sign onto x. Pairs of products fit int16 for maddubs
// (|q| <= 128 against |x| <= 127, and Q8A never holds -128). With AVX512-VNNI, vpdpbusd does the
// multiply and the 4-way sum in one instruction.
template <typename P>
inline __m256i piece_dot(const Piece& w, __m256i xq) {
  const __m256i u = P::kSigned ? _mm256_sign_epi8(w.q, w.q) : w.q;
  const __m256i s = P::kSigned ? _mm256_sign_epi8(xq, w.q) : xq;
  if (P::kSubScales) return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), w.sc16);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

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
        const __m256 p = _mm256_cvtepi32_ps(piece_dot<P>(w[r], xq));
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

// Every integer-dot type; float weights take the shared path.
void matmul_x86(const MatMulArgs& a) {
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

}  // namespace
}  // namespace pyinfer
