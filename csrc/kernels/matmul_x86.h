// The x86 integer-dot matmul, shared by the AVX2 and the AVX-512 kernel tables: each of those translation
// units includes this header with its own ISA flags and tile shape. Everything is in an anonymous
// namespace, so the two builds never meet at link time.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <type_traits>

#include "kernels/kernels.h"
#include "kernels/matmul_float_x86.h"
#include "kernels/quant_blocks.h"
#include "kernels/x86_common.h"



namespace pyinfer {
namespace {

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
  __m256i sc16;   // only for kSubScales types
  int32_t mins[2];  // only for kHalfMins types (Q2_K): its two halves' mins
  float d, m;
};

// Types whose blocks are one piece need no per-block preparation; K-quants decode the packed scales of a
// super-block once for its eight pieces.
struct OnePiecePerBlock {
  static constexpr int kPieces = 1;
  static constexpr bool kOffset = true;  // m != 0
  struct Cache {};
  static void prepare(const uint8_t*, int64_t, Cache&) {}
};

template <DType WT> struct WeightBlock;
// Q4_0, Q4_1, Q5_0 and Q5_1: nibbles (plus a fifth bit from qh), a scale, and an offset that is stored (the
// _1 types) or minus half the range times the scale (the _0 types: d * (q - 8) = d * q - 8d).
template <typename Block, bool kFifthBit, bool kStoredMin>
struct NibbleBlock : OnePiecePerBlock {
  static constexpr bool kSigned = false;
  static constexpr bool kSubScales = false;
  static void load(const uint8_t* row, int64_t b, const Cache&, Piece& p) {
    const Block& blk = reinterpret_cast<const Block*>(row)[b];
    p.q = unpack_nibbles(blk.qs);
    if constexpr (kFifthBit) p.q = _mm256_or_si256(p.q, fifth_bits(blk.qh));
    p.d = _cvtsh_ss(blk.d);
    if constexpr (kStoredMin)
      p.m = _cvtsh_ss(blk.m);
    else
      p.m = (kFifthBit ? -16.f : -8.f) * p.d;
  }
};
template <> struct WeightBlock<DType::Q4_0> : NibbleBlock<BlockQ4_0, false, false> {};
template <> struct WeightBlock<DType::Q4_1> : NibbleBlock<BlockQ4_1, false, true> {};
template <> struct WeightBlock<DType::Q5_0> : NibbleBlock<BlockQ5_0, true, false> {};
template <> struct WeightBlock<DType::Q5_1> : NibbleBlock<BlockQ5_1, true, true> {};
template <> struct WeightBlock<DType::Q8_0> : OnePiecePerBlock {
  static constexpr bool kOffset = false;
  static constexpr bool kSigned = true;
  static constexpr bool kSubScales = false;
  static void load(const uint8_t* row, int64_t b, const Cache&, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ8_0*>(row)[b];
    p.q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs));
    p.d = _cvtsh_ss(blk.d);
    p.m = 0.f;
  }
};
// Q4_K and Q5_K: piece j = b % 8 of super-block b / 8, with its scale d * sc[j] and offset -dmin * mn[j]
// decoded once per super-block.
template <DType WT> struct KQuantBlock {
  static constexpr bool kFive = WT == DType::Q5_K;
  static constexpr size_t kBytes = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  static constexpr int kPieces = 8;
  static constexpr bool kOffset = true;
  static constexpr bool kSigned = false;
  static constexpr bool kSubScales = false;
  struct Cache { float d[8], m[8]; };
  static __m256 scales(const Cache& c) { return _mm256_loadu_ps(c.d); }  // the eight pieces' d
  // Decode's tiles of 4 rows: the same products as prepare() and the scale products d * sc * d_x, for the four
  // rows at once, the rows as lanes: dsx[4 j + r] = d_r * sc_rj * xd[j], mins[4 j + r] = -dmin_r * mn_rj. The
  // 6-bit unpacking runs once on the rows' transposed scale bytes, not four times (it was half of a piece's
  // instructions in decode).
  static void prepare_rows4(const uint8_t* const* rows, int64_t sb, const float* xd, float* dsx, float* mins) {
    __m128i v[4];  // d, dmin, then the 12 scale bytes of each row's super-block
    for (int r = 0; r < 4; ++r) v[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[r] + sb * kBytes));
    const __m256 h = _mm256_cvtph_ps(_mm_unpacklo_epi64(_mm_unpacklo_epi32(v[0], v[1]), _mm_unpacklo_epi32(v[2], v[3])));
    const __m256 d = _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));  // d of rows 0..3, twice
    const __m256 neg_dmin = _mm256_xor_ps(_mm256_permutevar8x32_ps(h, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7)),
                                          _mm256_set1_ps(-0.f));
    // Scale byte k of row r at byte 4k + r: t0 holds k = 0..3, t1 4..7, t2 8..11.
    const __m128i lo01 = _mm_unpacklo_epi8(v[0], v[1]), hi01 = _mm_unpackhi_epi8(v[0], v[1]);
    const __m128i lo23 = _mm_unpacklo_epi8(v[2], v[3]), hi23 = _mm_unpackhi_epi8(v[2], v[3]);
    const __m128i t0 = _mm_unpackhi_epi16(lo01, lo23), t1 = _mm_unpacklo_epi16(hi01, hi23);
    const __m128i t2 = _mm_unpackhi_epi16(hi01, hi23);
    const __m128i low6 = _mm_set1_epi8(0x3f), low4 = _mm_set1_epi8(0x0f), top2 = _mm_set1_epi8(0x30);
    const __m128i sc[2] = {_mm_and_si128(t0, low6),  // pieces 0..3, then 4..7 (the top bits of bytes 0..3)
                           _mm_or_si128(_mm_and_si128(t2, low4), _mm_and_si128(_mm_srli_epi16(t0, 2), top2))};
    const __m128i mn[2] = {_mm_and_si128(t1, low6),
                           _mm_or_si128(_mm_and_si128(_mm_srli_epi16(t2, 4), low4),
                                        _mm_and_si128(_mm_srli_epi16(t1, 2), top2))};
    const __m256 dx = _mm256_loadu_ps(xd);
    for (int pair = 0; pair < 4; ++pair) {  // pieces 2 pair and 2 pair + 1: 4 rows each
      const __m128i s8 = pair % 2 ? _mm_srli_si128(sc[pair / 2], 8) : sc[pair / 2];
      const __m128i m8 = pair % 2 ? _mm_srli_si128(mn[pair / 2], 8) : mn[pair / 2];
      const __m256 scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(s8)));
      const __m256i which = _mm256_setr_epi32(2 * pair, 2 * pair, 2 * pair, 2 * pair, 2 * pair + 1, 2 * pair + 1,
                                              2 * pair + 1, 2 * pair + 1);
      _mm256_store_ps(dsx + 8 * pair, _mm256_mul_ps(scale, _mm256_permutevar8x32_ps(dx, which)));
      _mm256_store_ps(mins + 8 * pair, _mm256_mul_ps(neg_dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m8))));
    }
  }
  // The 12 packed bytes hold eight 6-bit scales and eight 6-bit mins: pieces 0..3 in the low 6 bits of bytes
  // 0..3 (scales) and 4..7 (mins), pieces 4..7 in the nibbles of bytes 8..11 with their top two bits in the
  // top bits of bytes 0..7. Rearranged four bytes at a time (32-bit words) into 8 scale bytes then 8 min
  // bytes, they widen and convert as two vectors: in decode a super-block's scalar unpacking cost about as
  // much as its eight pieces' dots (Q4_K ran at a third of Q4_0's bytes per second).
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) {
    const auto& k4 = *reinterpret_cast<const BlockQ4_K*>(row + sb * kBytes);  // d, dmin, scales: same offsets
    uint32_t w[3];
    __builtin_memcpy(w, k4.scales, 12);
    constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kTop2 = 0x03030303;
    // Built in registers: four 32-bit stores read back as one vector would stall store forwarding.
    const __m128i bytes = _mm_setr_epi32(int(w[0] & kLow6), int((w[2] & kLow4) | (((w[0] >> 6) & kTop2) << 4)),  // scales
                                         int(w[1] & kLow6), int(((w[2] >> 4) & kLow4) | (((w[1] >> 6) & kTop2) << 4)));  // mins
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
    _mm256_storeu_ps(c.d, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(k4.d)), sc));
    _mm256_storeu_ps(c.m, _mm256_mul_ps(_mm256_set1_ps(-_cvtsh_ss(k4.dmin)), mn));
  }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const int j = int(b % 8);
    const uint8_t* base = row + (b / 8) * kBytes;
    const uint8_t* qs = kFive ? reinterpret_cast<const BlockQ5_K*>(base)->qs : reinterpret_cast<const BlockQ4_K*>(base)->qs;
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (j / 2)));
    p.q = _mm256_and_si256((j & 1) ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(0x0f));
    if (kFive) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const BlockQ5_K*>(base)->qh));
      const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), _mm256_set1_epi8(1));
      p.q = _mm256_or_si256(p.q, _mm256_slli_epi16(hi, 4));
    }
    p.d = c.d[j];
    p.m = c.m[j];
  }
};
template <> struct WeightBlock<DType::Q4_K> : KQuantBlock<DType::Q4_K> {};
template <> struct WeightBlock<DType::Q5_K> : KQuantBlock<DType::Q5_K> {};
template <> struct WeightBlock<DType::Q6_K> {
  static constexpr int kPieces = 8;
  static constexpr bool kOffset = false;
  static constexpr bool kSigned = true;
  static constexpr bool kSubScales = true;
  // The 16 sub-block scales widened to int16 once per super-block, scales 0..7 in both 128-bit halves of `lo` and
  // 8..15 in both of `hi`: a piece's pair of scales is then one byte shuffle (five instructions a piece before).
  struct Cache { float d; __m256i lo, hi; };
  static __m256 scales(const Cache& c) { return _mm256_set1_ps(c.d); }
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) {
    const auto& blk = reinterpret_cast<const BlockQ6_K*>(row)[sb];
    c.d = _cvtsh_ss(blk.d);
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales)));
    c.lo = _mm256_permute4x64_epi64(s16, 0x44);
    c.hi = _mm256_permute4x64_epi64(s16, 0xee);
  }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    p.q = _mm256_sub_epi8(raw(row, b), _mm256_set1_epi8(32));
    load_scales(int(b % 8), c, p);
  }
  // Piece b's bytes q + 32 (0..63): decode takes them as the unsigned operand and the 32 back per activation lane.
  static __m256i raw(const uint8_t* row, int64_t b) {
    const auto& blk = reinterpret_cast<const BlockQ6_K*>(row)[b / 8];
    const int j = int(b % 8), half = j / 4, g = j % 4;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.ql + 64 * half + 32 * (g & 1)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * half));
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128((g >> 1) * 4)), _mm256_set1_epi8(0x0f));
    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
  }
  static void load_scales(int j, const Cache& c, Piece& p) {
    const int half = j / 4, g = j % 4;
    // Scales 2j (elements 0..15) and 2j + 1 (16..31): int16 number g * 2 (+ 1) of the half's vector.
    const char e0 = char(4 * g), e1 = char(4 * g + 1), o0 = char(4 * g + 2), o1 = char(4 * g + 3);
    const __m256i pick = _mm256_setr_epi8(e0, e1, e0, e1, e0, e1, e0, e1, e0, e1, e0, e1, e0, e1, e0, e1,
                                          o0, o1, o0, o1, o0, o1, o0, o1, o0, o1, o0, o1, o0, o1, o0, o1);
    p.sc16 = _mm256_shuffle_epi8(half ? c.hi : c.lo, pick);
    p.d = c.d;
    p.m = 0.f;
  }
};

}  // namespace
}  // namespace pyinfer

#include "kernels/matmul_lowbit_x86.h"  // Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4 and the IQ2/IQ3 grid types

namespace pyinfer {
namespace {

// Whether a weight block type has Q2_K's per-half mins (only the low-bit blocks declare kHalfMins).
template <typename P, typename = void> struct HasHalfMins { static constexpr bool value = false; };
template <typename P> struct HasHalfMins<P, std::void_t<decltype(P::kHalfMins)>> { static constexpr bool value = P::kHalfMins; };
template <typename P> constexpr bool half_mins_of() { return HasHalfMins<P>::value; }
template <DType WT> constexpr bool low_bit_type() {
  return WT == DType::Q2_K || WT == DType::Q3_K || WT == DType::IQ4_NL || WT == DType::IQ4_XS || WT == DType::MXFP4 ||
         WT == DType::IQ2_XXS || WT == DType::IQ2_XS || WT == DType::IQ2_S || WT == DType::IQ3_XXS || WT == DType::IQ3_S;
}

// The sums of 32 activation bytes' two halves (elements 0..15, 16..31): what Q2_K's mins multiply.
inline void half_sums(__m256i xq, int32_t& s0, int32_t& s1) {
  const __m256i four = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), xq), _mm256_set1_epi16(1));
  __m128i lo = _mm256_castsi256_si128(four), hi = _mm256_extracti128_si256(four, 1);
  lo = _mm_hadd_epi32(lo, hi);  // [l0+l1, l2+l3, h0+h1, h2+h3]
  lo = _mm_hadd_epi32(lo, lo);  // [low half, high half, ..]
  s0 = _mm_cvtsi128_si32(lo);
  s1 = _mm_extract_epi32(lo, 1);
}
// Q2_K's integer offset of a piece: its mins times the halves' sums.
inline int32_t half_mins_dot(const Piece& w, __m256i xq) {
  int32_t s0, s1;
  half_sums(xq, s0, s1);
  return w.mins[0] * s0 + w.mins[1] * s1;
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

// acc += four byte products per 32-bit lane: u unsigned, s signed.
inline __m256i dot4(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// Integer dot of a piece with 32 activation bytes, as 8 int32 partial sums. Unsigned x signed is what
// maddubs takes: signed weights move their sign onto x. Pairs of products fit int16 (|q| <= 128 against
// |x| <= 127, and Q8A never holds -128). With AVX512-VNNI, vpdpbusd does both steps in one instruction.
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

// Piece b of each of NR rows (a K-quant super-block's scales are unpacked at its first piece).
template <typename P, int NR>
inline void load_pieces(const uint8_t* const* wrows, int64_t b, typename P::Cache (&cache)[NR], Piece (&w)[NR]) {
  if (b % P::kPieces == 0)
    for (int r = 0; r < NR; ++r) P::prepare(wrows[r], b / P::kPieces, cache[r]);
  for (int r = 0; r < NR; ++r) P::load(wrows[r], b, cache[r], w[r]);
}

// The exact integer dot of a piece: the sum of piece_dot's 8 lanes.
inline int32_t lane_sum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}

// Four rows' 8-lane partial dots to [rows 0..3 of lanes 0..3 | of lanes 4..7], where each partial is at most
// 16,256 in magnitude (four products of |q| <= 32 and |x| <= 127), so two of them fit 16 bits: packed to 16 bits and
// summed in pairs by a multiply-add, one shuffle and one multiply a level where a horizontal add is two shuffles and
// an add. Decode's reduction was what made the exact sums slower than the lane sums they replaced (Q4_K, one
// thread, in cache: 25 -> 21 GB/s with horizontal adds).
inline __m256i pack_sums4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
  const __m256i one = _mm256_set1_epi16(1);
  auto level = [&](__m256i x, __m256i y) { return _mm256_madd_epi16(_mm256_packs_epi32(x, y), one); };
  return level(level(v0, v1), level(v2, v3));
}

// The exact integer dots of rows 0..3 of pieces a (v) and b (u), from their 8-lane partial dots: rows 0..3 of a in
// the low half, of b in the high one. kPack: the partials fit pack_sums4 (weights under 32).
template <bool kPack>
inline __m256i lane_sums4x2(__m256i v0, __m256i v1, __m256i v2, __m256i v3, __m256i u0, __m256i u1, __m256i u2,
                            __m256i u3) {
  __m256i a, b;
  if constexpr (kPack) {
    a = pack_sums4(v0, v1, v2, v3);
    b = pack_sums4(u0, u1, u2, u3);
  } else {
    a = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    b = _mm256_hadd_epi32(_mm256_hadd_epi32(u0, u1), _mm256_hadd_epi32(u2, u3));
  }
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// Every path sums a row's products in one order: per 32-element block b the exact integer dot n_b (a Q6_K block's
// two halves already times their scales), then acc = fma(float(n_b), d_w * d_x, acc) block after block, the
// offsets in their own chain off = fma(m_w, s_x, off), and acc + off last. Integers are exact and the float steps
// are the same operations, so decode (gemv_tile4), the generic tiles (tile) and prefill's lanes
// (matmul_lanes_x86.h) give a token the same bits alone, in a batch, or through the gather path, and the scalar
// reference (matmul_scalar.cpp) gives them too.

// Every piece of a row in order, a K-quant super-block's scales unpacked at its first piece: fn(b, piece). For the
// prefill paths that decode a chunk of rows once (lane blocks, AMX tiles).
template <typename P, typename Fn>
inline void each_piece(const uint8_t* row, int64_t nb, Fn fn) {
  typename P::Cache cache{};
  for (int64_t b = 0; b < nb; ++b) {
    if (b % P::kPieces == 0) P::prepare(row, b / P::kPieces, cache);
    Piece p;
    P::load(row, b, cache, p);
    fn(b, p);
  }
}

// NR weight rows x NT tokens, generic: each weight piece is decoded once and reused NT times. For decode's last rows
// and rows too long for gemv_rows.
template <DType WT, int NR, int NT>
inline void tile(const uint8_t* const* wrows, const BlockQ8A* const* xrows, int64_t nb, float (&res)[NR][NT]) {
  using P = WeightBlock<WT>;
  float acc[NR][NT], off[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = off[r][t] = 0.f;
  typename P::Cache cache[NR]{};  // (filled at each super-block's first piece, b = 0 included)
  for (int64_t b = 0; b < nb; ++b) {
    Piece w[NR];
    load_pieces<P, NR>(wrows, b, cache, w);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8A& xb = xrows[t][b];
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
      for (int r = 0; r < NR; ++r) {
        acc[r][t] = std::fma(float(lane_sum(piece_dot<P>(w[r], xq))), w[r].d * xb.d, acc[r][t]);
        if constexpr (half_mins_of<P>())
          off[r][t] = std::fma(float(half_mins_dot(w[r], xq)), w[r].m * xb.d, off[r][t]);
        else if (P::kOffset)
          off[r][t] = std::fma(w[r].m, xb.s, off[r][t]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) res[r][t] = acc[r][t] + off[r][t];
}

// Decode of the low-bit types, 4 rows a tile: the rows' exact integer dots of two pieces reduced together
// (lane_sums4x2, as gemv_tile4 does), then each row's float steps as one 4-lane vector, in tile()'s order (a row's
// acc = fma(float(dot), d_w * d_x, acc) block after block; Q2_K's mins in their own chain). tile() reduced every
// piece of every row on its own (Q2_K decode at a third of this speed).
template <DType WT>
inline void lowbit_tile4(const uint8_t* const* wrows, const BlockQ8A* x, int64_t nb, float (&res)[4]) {
  using P = WeightBlock<WT>;
  constexpr bool kMins = half_mins_of<P>();
  __m128 acc = _mm_setzero_ps(), off = _mm_setzero_ps();
  typename P::Cache cache[4]{};
  auto step = [&](int64_t b, const Piece (&w)[4], __m128 dot, __m128 mins) {
    const __m128 dx = _mm_set1_ps(x[b].d);
    acc = _mm_fmadd_ps(dot, _mm_mul_ps(_mm_setr_ps(w[0].d, w[1].d, w[2].d, w[3].d), dx), acc);
    if constexpr (kMins) off = _mm_fmadd_ps(mins, _mm_mul_ps(_mm_setr_ps(w[0].m, w[1].m, w[2].m, w[3].m), dx), off);
  };
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    Piece w[2][4];
    __m256i v[2][4];
    alignas(32) int32_t mins[8];  // Q2_K: [piece][row] offsets, from the halves' sums shared by the 4 rows
    for (int h = 0; h < 2; ++h) {
      load_pieces<P, 4>(wrows, b + h, cache, w[h]);
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b + h].qs));
      for (int r = 0; r < 4; ++r) v[h][r] = piece_dot<P>(w[h][r], xq);
      if constexpr (kMins) {
        int32_t s0, s1;
        half_sums(xq, s0, s1);
        for (int r = 0; r < 4; ++r) mins[4 * h + r] = w[h][r].mins[0] * s0 + w[h][r].mins[1] * s1;
      }
    }
    const __m256 f = _mm256_cvtepi32_ps(lane_sums4x2<false>(v[0][0], v[0][1], v[0][2], v[0][3], v[1][0], v[1][1], v[1][2], v[1][3]));
    __m256 fm = _mm256_setzero_ps();
    if constexpr (kMins) fm = _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(mins)));
    step(b, w[0], _mm256_castps256_ps128(f), _mm256_castps256_ps128(fm));
    step(b + 1, w[1], _mm256_extractf128_ps(f, 1), _mm256_extractf128_ps(fm, 1));
  }
  if (b < nb) {  // an odd last block (IQ4_NL, MXFP4)
    Piece w[4];
    load_pieces<P, 4>(wrows, b, cache, w);
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    alignas(16) float dot[4], mins[4] = {0.f, 0.f, 0.f, 0.f};
    for (int r = 0; r < 4; ++r) {
      dot[r] = float(lane_sum(piece_dot<P>(w[r], xq)));
      if constexpr (kMins) mins[r] = float(half_mins_dot(w[r], xq));
    }
    step(b, w, _mm_load_ps(dot), _mm_load_ps(mins));
  }
  _mm_storeu_ps(res, _mm_add_ps(acc, off));
}

// Blocks per step of gemv_tile4: a super-block, or two blocks of the one-piece types.
template <DType WT>
constexpr int gemv_step() {
  return WeightBlock<WT>::kPieces == 1 ? 2 : WeightBlock<WT>::kPieces;
}

// The fp16 d (and stored m) of a one-piece type's block b.
template <DType WT>
inline const uint16_t* block_fp16(const uint8_t* row, int64_t b) {
  return reinterpret_cast<const uint16_t*>(row + b * int64_t(dtype_block_bytes(WT)));
}

// What decode precomputes from the activation once per call: its block scales, and per block the integers that
// signed weights taken as unsigned need back (Q8_0 with VNNI: 128 * sum(x); Q6_K: minus 32 * the sum of each
// lane's four bytes).
struct DecodeActivation {
  const float* d;
  const int32_t* sum;     // [nb], Q8_0
  const __m256i* lanes;   // [nb], Q6_K
};

// Decode (one token), one tile of 4 weight rows, the rows as the lanes of the float work: pieces go in pairs (a
// K-quant's scales and its bytes are read once for its pieces), the four rows' integer dots of a pair are reduced
// together (lane_sums4x2), and their scale products d_w * d_x are one vector a piece. Signed weights go in as
// unsigned bytes where the activation alone can give the difference back: Q8_0 with VNNI as q + 128 (minus
// 128 * sum(x) a block), Q6_K as q + 32 (each lane's dot starts at minus 32 * its four activation bytes, so its sum
// is exact and small enough to pack; its two scales multiply the rows' half sums after the reduction). With `pf`,
// each super-block step asks for the next `pf_bytes` of the stream from `pf` on into L2 (gemv_rows keeps them
// kAheadBytes ahead).
template <DType WT>
inline void gemv_tile4(const uint8_t* const* wrows, const BlockQ8A* x, const DecodeActivation& xa, int64_t nb,
                       float (&res)[4], const char* pf, int64_t pf_bytes) {
  using P = WeightBlock<WT>;
  constexpr int K = gemv_step<WT>();
  constexpr bool kBiased = WT == DType::Q8_0 && kVnni;
  constexpr bool kSixBit = WT == DType::Q6_K;
  constexpr bool kOnePiece = P::kPieces == 1;
  const float* xd = xa.d;
  __m128 acc = _mm_setzero_ps(), off = _mm_setzero_ps();
  typename P::Cache cache[4]{};  // (zeroed: Q4_K/Q5_K's row lanes never fill it, and their loads read only q)
  // Q4_K and Q5_K: scales and offsets are unpacked for the four rows at once, already in [piece][row] order.
  constexpr bool kRowLanes = P::kPieces == 8 && P::kOffset;
  for (int64_t sb = 0; sb < nb / K; ++sb) {
    const int64_t b0 = sb * K;  // so that b0 + j splits into super-block and piece at compile time
    if (pf)
      for (int64_t o = 0; o < pf_bytes; o += 64) _mm_prefetch(pf + sb * pf_bytes + o, _MM_HINT_T1);
    alignas(32) float sv[kRowLanes ? 4 * K : 1];    // scale products d_w * d_x, [piece][row]
    alignas(32) float mins[kRowLanes ? 4 * K : 1];  // [piece][row]
    alignas(16) int8_t sc6[kSixBit ? 64 : 1];        // Q6_K: [piece][half][row] scales
    __m128 d4 = _mm_setzero_ps();                    // Q6_K: the rows' super-block d
    if constexpr (kRowLanes) {
      P::prepare_rows4(wrows, sb, xd + b0, sv, mins);
    } else if constexpr (kSixBit) {
      __m128i s[4];
      for (int r = 0; r < 4; ++r) {
        const auto& blk = reinterpret_cast<const BlockQ6_K*>(wrows[r])[sb];
        s[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales));
      }
      d4 = _mm_cvtph_ps(_mm_setr_epi16(short(reinterpret_cast<const BlockQ6_K*>(wrows[0])[sb].d),
                                       short(reinterpret_cast<const BlockQ6_K*>(wrows[1])[sb].d),
                                       short(reinterpret_cast<const BlockQ6_K*>(wrows[2])[sb].d),
                                       short(reinterpret_cast<const BlockQ6_K*>(wrows[3])[sb].d), 0, 0, 0, 0));
      // Scale k of row r to byte 4 k + r.
      const __m128i t01 = _mm_unpacklo_epi8(s[0], s[1]), t01h = _mm_unpackhi_epi8(s[0], s[1]);
      const __m128i t23 = _mm_unpacklo_epi8(s[2], s[3]), t23h = _mm_unpackhi_epi8(s[2], s[3]);
      auto* o = reinterpret_cast<__m128i*>(sc6);
      _mm_store_si128(o, _mm_unpacklo_epi16(t01, t23));
      _mm_store_si128(o + 1, _mm_unpackhi_epi16(t01, t23));
      _mm_store_si128(o + 2, _mm_unpacklo_epi16(t01h, t23h));
      _mm_store_si128(o + 3, _mm_unpackhi_epi16(t01h, t23h));
    }
    // One-piece types: the rows' d (and offsets) of both blocks, one conversion.
    __m256 dd = _mm256_setzero_ps(), mm = _mm256_setzero_ps();
    if constexpr (kOnePiece) {
      alignas(16) uint16_t h[8], hm[8];
      if constexpr (WT == DType::MXFP4) {  // an E8M0 exponent byte, not an fp16 scale: e8m0_half, 8 lanes at once
        alignas(8) uint8_t e[8];
        for (int k = 0; k < 2; ++k)
          for (int r = 0; r < 4; ++r) e[4 * k + r] = wrows[r][(b0 + k) * int64_t(sizeof(BlockMXFP4))];
        const __m256i ei = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(e)));
        const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(ei, _mm256_set1_epi32(1)), 23);
        const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), ei);  // e 0 and 1: subnormal halves
        const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), ei);
        dd = _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small));
      } else {
        for (int k = 0; k < 2; ++k)
          for (int r = 0; r < 4; ++r) {
            const uint16_t* f = block_fp16<WT>(wrows[r], b0 + k);
            h[4 * k + r] = f[0];
            if constexpr (WT == DType::Q4_1 || WT == DType::Q5_1) hm[4 * k + r] = f[1];
          }
        dd = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
      }
      if constexpr (WT == DType::Q4_1 || WT == DType::Q5_1)
        mm = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(hm)));
      else if constexpr (P::kOffset)
        mm = _mm256_mul_ps(_mm256_set1_ps(WT == DType::Q5_0 ? -16.f : -8.f), dd);
    }
#pragma GCC unroll 4
    for (int j = 0; j < K; j += 2) {
      __m256i v[2][4];
      for (int h = 0; h < 2; ++h) {
        const int64_t b = b0 + j + h;
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
        for (int r = 0; r < 4; ++r) {
          if constexpr (kBiased) {
            const auto& blk = reinterpret_cast<const BlockQ8_0*>(wrows[r])[b];
            const __m256i u = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs)),
                                               _mm256_set1_epi8(char(0x80)));
            v[h][r] = dot4(_mm256_setzero_si256(), u, xq);
          } else if constexpr (kSixBit) {
            v[h][r] = dot4(xa.lanes[b], P::raw(wrows[r], b), xq);
          } else {
            Piece w;
            P::load(wrows[r], b, cache[r], w);
            v[h][r] = piece_dot<P>(w, xq);
          }
        }
      }
      __m256i n;
      if constexpr (kSixBit) {
        auto scaled = [&](int h) {  // [rows' half 0 | half 1] sums times their scales
          const __m256i s = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc6 + 8 * (j + h))));
          return _mm256_mullo_epi32(pack_sums4(v[h][0], v[h][1], v[h][2], v[h][3]), s);
        };
        const __m256i a = scaled(0), b = scaled(1);
        n = _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
      } else {
        constexpr bool kPack = !P::kSigned && !P::kSubScales;  // weights 0..31: a lane's 4 products fit 16 bits
        n = lane_sums4x2<kPack>(v[0][0], v[0][1], v[0][2], v[0][3], v[1][0], v[1][1], v[1][2], v[1][3]);
      }
      if constexpr (kBiased)
        n = _mm256_sub_epi32(n, _mm256_setr_m128i(_mm_set1_epi32(xa.sum[b0 + j]), _mm_set1_epi32(xa.sum[b0 + j + 1])));
      const __m256 f = _mm256_cvtepi32_ps(n);
      __m256 scale2 = _mm256_setzero_ps();  // one-piece types: both blocks' scale products
      if constexpr (kOnePiece)
        scale2 = _mm256_mul_ps(dd, _mm256_setr_m128(_mm_set1_ps(xd[b0]), _mm_set1_ps(xd[b0 + 1])));
      for (int h = 0; h < 2; ++h) {
        const int64_t b = b0 + j + h;
        __m128 scale;
        if constexpr (kRowLanes)
          scale = _mm_load_ps(&sv[4 * (j + h)]);
        else if constexpr (kOnePiece)
          scale = h ? _mm256_extractf128_ps(scale2, 1) : _mm256_castps256_ps128(scale2);
        else  // Q6_K
          scale = _mm_mul_ps(d4, _mm_set1_ps(xd[b]));
        acc = _mm_fmadd_ps(h ? _mm256_extractf128_ps(f, 1) : _mm256_castps256_ps128(f), scale, acc);
        if constexpr (kRowLanes)
          off = _mm_fmadd_ps(_mm_load_ps(&mins[4 * (j + h)]), _mm_set1_ps(x[b].s), off);
        else if constexpr (kOnePiece && P::kOffset)
          off = _mm_fmadd_ps(h ? _mm256_extractf128_ps(mm, 1) : _mm256_castps256_ps128(mm), _mm_set1_ps(x[b].s), off);
      }
    }
  }
  _mm_storeu_ps(res, _mm_add_ps(acc, off));
}

// Decode copies the activation's scales to the stack for rows of up to 65,536 elements (Q6_K: 16,384, for its
// lanes); longer ones take tile().
constexpr int64_t kMaxDecodeBlocks = 2048;
constexpr int64_t kMaxSixBitBlocks = 512;

template <DType WT>
constexpr bool gemv_fits(int64_t nb) {
  // The low-bit super-block types take lowbit_tile4; IQ4_NL and MXFP4 (one 32-element block a piece, like Q4_0)
  // take gemv_tile4's one-piece path.
  if constexpr (low_bit_type<WT>() && WT != DType::IQ4_NL && WT != DType::MXFP4) return false;
  return nb <= (WT == DType::Q6_K ? kMaxSixBitBlocks : kMaxDecodeBlocks) && nb % gemv_step<WT>() == 0;
}

// Decode of the one token x, rows [a.r0, a.r1) in tiles of 4 (gemv_tile4); returns the first row left (under 4).
template <DType WT, typename RowOf>
int64_t gemv_rows(const MatMulArgs& a, RowOf row, const BlockQ8A* x, int64_t nb) {
  constexpr int NR = 4;
  const int64_t r0 = a.r0, r1 = a.r1;
  int64_t r = r0, ahead = r0 + NR;
  float xd[kMaxDecodeBlocks];
  int32_t xsum[WT == DType::Q8_0 ? kMaxDecodeBlocks : 1];
  __m256i lanes[WT == DType::Q6_K ? kMaxSixBitBlocks : 1];
  for (int64_t b = 0; b < nb; ++b) xd[b] = x[b].d;
  if constexpr (WT == DType::Q8_0)
    for (int64_t b = 0; b < nb; ++b) {
      int32_t s = 0;
      for (int e = 0; e < 32; ++e) s += x[b].qs[e];
      xsum[b] = 128 * s;
    }
  if constexpr (WT == DType::Q6_K)
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i four = dot4(_mm256_setzero_si256(), _mm256_set1_epi8(1),
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs)));
      lanes[b] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(four, 5));
    }
  const DecodeActivation xa{xd, xsum, lanes};
  // Contiguous rows (no gather list, no pages): one stream, prefetched a fixed distance ahead in bytes.
  const bool stream = !a.row_ids && !a.w_rows;
  const int64_t pieces = nb / gemv_step<WT>(), tile_bytes = NR * int64_t(a.w_row_bytes);
  // The stream's first byte not yet asked for, and its end. Each tile asks for the bytes that keep the
  // prefetch kAheadBytes past it, at most three tiles' worth: from a call's start (every matmul of a decode
  // step is one) the distance builds up over the first tiles instead of in one burst.
  const char* pf_next = stream ? reinterpret_cast<const char*>(a.w + r0 * int64_t(a.w_row_bytes)) : nullptr;
  const char* const pf_end = stream ? reinterpret_cast<const char*>(a.w + r1 * int64_t(a.w_row_bytes)) : nullptr;
  for (; r + NR <= r1; r += NR) {
    const uint8_t* wr[NR];
    for (int i = 0; i < NR; ++i) wr[i] = a.row(row(r + i));
    int64_t pf_step = 0;  // bytes asked for per super-block of this tile
    if (stream) {
      const char* target = std::min(reinterpret_cast<const char*>(wr[0]) + tile_bytes + kAheadBytes, pf_end);
      pf_step = std::min((target - pf_next) / pieces, 3 * tile_bytes / pieces);
      if (pf_step < 0) pf_step = 0;
    } else {
      prefetch_rows_ahead<NR>(a, row, ahead, std::min(r + kAheadRows + NR, r1));  // x86_common.h
    }
    float res[NR];
    gemv_tile4<WT>(wr, x, xa, nb, res, pf_step ? pf_next : nullptr, pf_step);
    pf_next += pf_step * pieces;
    for (int i = 0; i < NR; ++i) a.dst[row(r + i)] = res[i];
  }
  return r;
}

// Decode: rows [a.r0, a.r1) of the one token, through gemv_rows, or in generic tiles of 4 rows where a row is too
// long for gemv_rows' stack copies of the activation's scales; the last rows one at a time.
template <DType WT>
void decode_rows(const MatMulArgs& a) {
  const int64_t nb = a.k / kQuantBlock;
  const BlockQ8A* xr[1] = {static_cast<const BlockQ8A*>(a.x)};
  auto row = [&](int64_t i) -> int64_t { return a.row_ids ? a.row_ids[i] : i; };
  constexpr int NR = 4;
  int64_t r = a.r0, ahead = a.r0 + NR;  // the first row not yet prefetched (the first tile is loaded on demand)
  if (gemv_fits<WT>(nb)) r = gemv_rows<WT>(a, row, xr[0], nb);
  if constexpr (low_bit_type<WT>() && WT != DType::IQ4_NL && WT != DType::MXFP4)
    for (; r + NR <= a.r1; r += NR) {
      const uint8_t* wr[NR];
      for (int i = 0; i < NR; ++i) wr[i] = a.row(row(r + i));
      prefetch_rows_ahead<NR>(a, row, ahead, std::min(r + kAheadRows + NR, a.r1));  // x86_common.h
      float res[NR];
      lowbit_tile4<WT>(wr, xr[0], nb, res);
      for (int i = 0; i < NR; ++i) a.dst[row(r + i)] = res[i];
    }
  for (; r + NR <= a.r1; r += NR) {
    const uint8_t* wr[NR];
    for (int i = 0; i < NR; ++i) wr[i] = a.row(row(r + i));
    prefetch_rows_ahead<NR>(a, row, ahead, std::min(r + kAheadRows + NR, a.r1));  // x86_common.h
    float res[NR][1];
    tile<WT, NR, 1>(wr, xr, nb, res);
    for (int i = 0; i < NR; ++i) a.dst[row(r + i)] = res[i][0];
  }
  for (; r < a.r1; ++r) {
    const uint8_t* wr[1] = {a.row(row(r))};
    float res[1][1];
    tile<WT, 1, 1>(wr, xr, nb, res);
    a.dst[row(r)] = res[0][0];
  }
}

}  // namespace
}  // namespace pyinfer

#include "kernels/matmul_lanes_x86.h"  // prefill's lane groups, on the pieces above

namespace pyinfer {
namespace {

// Tile shapes: decode takes 4 rows a tile on both x86 tables (gemv_tile4), since its weights stream through the
// byte-distance prefetch (adjacent rows are one stream, not four): on a 2-core Zen 4 VM, 16 decode steps of the
// Qwen2.5-1.5B-shaped Q4_K_M file (bench/real_shapes.py) took 0.65 s with 4 rows, 0.75-0.76 with 2 and 0.78-0.82
// with 8 on AVX-512. Prefill takes lane groups of 8 rows x tokens (matmul_lanes_x86.h); an ISA with 32 vector
// registers (AVX-512VL) holds more groups. Float weights (F16, BF16, F32: matmul_float_x86.h) keep the rows
// measured for their own row-distance prefetch (kFloatDecodeRows); `rows` and `tokens` are their prefill tile.
template <int kLaneGroups, int kRows, int kTokens, int kFloatDecodeRows>
struct TileShape {
  static constexpr int lane_groups = kLaneGroups, rows = kRows, tokens = kTokens, float_decode_rows = kFloatDecodeRows;
};

// Prefill of Q2_K (its half mins are not in the lane blocks): tiles of NR rows x NT tokens from (r, t).
template <DType WT, int NR, int NT>
void prefill_tile_at(const MatMulArgs& a, int64_t nb, int64_t r, int64_t t) {
  const uint8_t* wr[NR];
  const BlockQ8A* xr[NT];
  int64_t out_row[NR];
  for (int i = 0; i < NR; ++i) {
    out_row[i] = a.row_ids ? a.row_ids[r + i] : r + i;
    wr[i] = a.row(out_row[i]);
  }
  for (int j = 0; j < NT; ++j)
    xr[j] = reinterpret_cast<const BlockQ8A*>(static_cast<const uint8_t*>(a.x) + (t + j) * int64_t(a.x_row_bytes));
  float res[NR][NT];
  tile<WT, NR, NT>(wr, xr, nb, res);
  for (int i = 0; i < NR; ++i)
    for (int j = 0; j < NT; ++j) a.dst[(t + j) * a.ldd + out_row[i]] = res[i][j];
}

template <DType WT>
void prefill_tiles(const MatMulArgs& a) {
  const int64_t nb = a.k / kQuantBlock;
  int64_t t = 0;
  for (; t + 4 <= a.n_tok; t += 4) {
    int64_t r = a.r0;
    for (; r + 4 <= a.r1; r += 4) prefill_tile_at<WT, 4, 4>(a, nb, r, t);
    for (; r < a.r1; ++r) prefill_tile_at<WT, 1, 4>(a, nb, r, t);
  }
  for (; t < a.n_tok; ++t) {
    int64_t r = a.r0;
    for (; r + 4 <= a.r1; r += 4) prefill_tile_at<WT, 4, 1>(a, nb, r, t);
    for (; r < a.r1; ++r) prefill_tile_at<WT, 1, 1>(a, nb, r, t);
  }
}

template <DType WT, typename S>
void matmul_typed(const MatMulArgs& a) {
  if (a.n_tok == 1) return decode_rows<WT>(a);
  if constexpr (half_mins_of<WeightBlock<WT>>())
    return prefill_tiles<WT>(a);
  else
    matmul_lanes<WT, S::lane_groups, 4>(a);
}

// Every integer-dot type, and the float weights (matmul_float_x86.h).
template <typename S>
void matmul_x86(const MatMulArgs& a) {
  switch (a.wtype) {
    case DType::Q4_0: return matmul_typed<DType::Q4_0, S>(a);
    case DType::Q4_1: return matmul_typed<DType::Q4_1, S>(a);
    case DType::Q8_0: return matmul_typed<DType::Q8_0, S>(a);
    case DType::Q5_0: return matmul_typed<DType::Q5_0, S>(a);
    case DType::Q5_1: return matmul_typed<DType::Q5_1, S>(a);
    case DType::Q4_K: return matmul_typed<DType::Q4_K, S>(a);
    case DType::Q5_K: return matmul_typed<DType::Q5_K, S>(a);
    case DType::Q6_K: return matmul_typed<DType::Q6_K, S>(a);
    case DType::Q2_K: return matmul_typed<DType::Q2_K, S>(a);
    case DType::Q3_K: return matmul_typed<DType::Q3_K, S>(a);
    case DType::IQ4_NL: return matmul_typed<DType::IQ4_NL, S>(a);
    case DType::IQ4_XS: return matmul_typed<DType::IQ4_XS, S>(a);
    case DType::MXFP4: return matmul_typed<DType::MXFP4, S>(a);
    case DType::IQ2_XXS: return matmul_typed<DType::IQ2_XXS, S>(a);
    case DType::IQ2_XS: return matmul_typed<DType::IQ2_XS, S>(a);
    case DType::IQ2_S: return matmul_typed<DType::IQ2_S, S>(a);
    case DType::IQ3_XXS: return matmul_typed<DType::IQ3_XXS, S>(a);
    case DType::IQ3_S: return matmul_typed<DType::IQ3_S, S>(a);
    default:
      if (!float_matmul_x86<S>(a)) matmul_float_weights(a);
  }
}

}  // namespace
}  // namespace pyinfer
