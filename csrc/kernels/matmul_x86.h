// The x86 integer-dot matmul, shared by the AVX2 and the AVX-512 kernel tables: each of those translation
// units includes this header with its own ISA flags and tile shape. Everything is in an anonymous
// namespace, so the two builds never meet at link time.
#pragma once
#include <immintrin.h>

#include <cmath>

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
  __m256i sc16;  // only for kSubScales types
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
    const auto& blk = reinterpret_cast<const BlockQ6_K*>(row)[b / 8];
    const int j = int(b % 8), half = j / 4, g = j % 4;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.ql + 64 * half + 32 * (g & 1)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * half));
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128((g >> 1) * 4)), _mm256_set1_epi8(0x0f));
    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
    p.q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
    // Scales 2j (elements 0..15) and 2j + 1 (16..31): int16 number g * 2 (+ 1) of the half's vector.
    const char e0 = char(4 * g), e1 = char(4 * g + 1), o0 = char(4 * g + 2), o1 = char(4 * g + 3);
    const __m256i pick = _mm256_setr_epi8(e0, e1, e0, e1, e0, e1, e0, e1, e0, e1, e0, e1, e0, e1, e0, e1,
                                          o0, o1, o0, o1, o0, o1, o0, o1, o0, o1, o0, o1, o0, o1, o0, o1);
    p.sc16 = _mm256_shuffle_epi8(half ? c.hi : c.lo, pick);
    p.d = c.d;
    p.m = 0.f;
  }
};

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

// NR weight rows x NT tokens: each weight piece is decoded once and reused NT times.
template <DType WT, int NR, int NT>
inline void tile(const uint8_t* const* wrows, const BlockQ8A* const* xrows, int64_t nb, float (&res)[NR][NT]) {
  using P = WeightBlock<WT>;
  __m256 acc[NR][NT];
  float off[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) { acc[r][t] = _mm256_setzero_ps(); off[r][t] = 0.f; }
  typename P::Cache cache[NR];
  for (int64_t b = 0; b < nb; ++b) {
    Piece w[NR];
    load_pieces<P, NR>(wrows, b, cache, w);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8A& xb = xrows[t][b];
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
      for (int r = 0; r < NR; ++r) {
        const __m256 p = _mm256_cvtepi32_ps(piece_dot<P>(w[r], xq));
        acc[r][t] = _mm256_fmadd_ps(p, _mm256_set1_ps(w[r].d * xb.d), acc[r][t]);
        // An explicit FMA, as tile_tokens' vector one: the gather path (one token) and the dense path (token
        // tiles) must give the same bits whatever the compiler's contraction setting.
        if (P::kOffset) off[r][t] = std::fma(w[r].m, xb.s, off[r][t]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) res[r][t] = hsum(acc[r][t]) + off[r][t];
}

// The activation scales of up to 8 tokens as the lanes of a vector, per block: d (the Q8A scale) and s (its
// sum times d) of tokens 0..7, lanes past the tile's tokens 0. Built once per token tile and row chunk, they
// are one aligned load per block in tile_tokens, where two 8-lane gathers were: on Zen 3 those cost about as
// much as the block's integer dots.
struct alignas(32) TokenScales {
  float d[8], s[8];
};

template <int NT>
inline void token_scales(const BlockQ8A* x0, int32_t x_stride, int64_t nb, TokenScales* out) {
  for (int64_t b = 0; b < nb; ++b) {
    TokenScales& o = out[b];
    for (int t = 0; t < 8; ++t) {
      if (t < NT) {
        const BlockQ8A& xt = *reinterpret_cast<const BlockQ8A*>(reinterpret_cast<const uint8_t*>(x0 + b) + t * x_stride);
        o.d[t] = xt.d;
        o.s[t] = xt.s;
      } else {
        o.d[t] = o.s[t] = 0.f;
      }
    }
  }
}

// NR weight rows x NT (2..8) tokens of consecutive activation rows `x_stride` bytes apart, their scales in
// `xs` (token_scales). Like tile(), but the per-block float work is vectorised across the tokens, so each
// (row, token) pair costs the integer dot, a lane permute and an FMA.
template <typename P, int NR, int NT>
inline void tile_tokens(const uint8_t* const* wrows, const BlockQ8A* x0, int32_t x_stride, int64_t nb,
                        const TokenScales* xs, float (&res)[NR][NT]) {
  static_assert(NT >= 2 && NT <= 8, "tokens are lanes of one vector");
  __m256 acc[NR][NT];
  __m256 off[NR];
  for (int r = 0; r < NR; ++r) {
    off[r] = _mm256_setzero_ps();
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  typename P::Cache cache[NR];
  for (int64_t b = 0; b < nb; ++b) {
    Piece w[NR];
    load_pieces<P, NR>(wrows, b, cache, w);
    const __m256 dx = _mm256_load_ps(xs[b].d);
    __m256 dd[NR];
    for (int r = 0; r < NR; ++r) {
      dd[r] = _mm256_mul_ps(dx, _mm256_set1_ps(w[r].d));
      if (P::kOffset) off[r] = _mm256_fmadd_ps(_mm256_load_ps(xs[b].s), _mm256_set1_ps(w[r].m), off[r]);
    }
    for (int t = 0; t < NT; ++t) {
      const BlockQ8A& xt = *reinterpret_cast<const BlockQ8A*>(reinterpret_cast<const uint8_t*>(x0 + b) + t * x_stride);
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt.qs));
      const __m256i tt = _mm256_set1_epi32(t);
      for (int r = 0; r < NR; ++r) {
        const __m256 p = _mm256_cvtepi32_ps(piece_dot<P>(w[r], xq));
        acc[r][t] = _mm256_fmadd_ps(p, _mm256_permutevar8x32_ps(dd[r], tt), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    float o[8];
    _mm256_storeu_ps(o, off[r]);
    for (int t = 0; t < NT; ++t) res[r][t] = hsum(acc[r][t]) + o[t];
  }
}

// Decode (one token), one tile of NR weight rows. The same sums in the same order as tile<WT, NR, 1> and
// tile_tokens (a token gets the same bits alone, in a batch, or through the gather path), in fewer instructions:
// a super-block's pieces are unrolled (a K-quant's scales and its bytes are read once for its pieces), a K-quant's
// eight scale products d_w * d_x are one vector multiply per super-block and reach the FMA as a broadcast from
// memory, and the activation's scales `xd` are a contiguous copy made once per call. With `pf`, each super-block
// step asks for the next `pf_bytes` of the stream from `pf` on into L2 (gemv_rows keeps them kAheadBytes ahead).
template <DType WT, int NR>
inline void gemv_tile(const uint8_t* const* wrows, const BlockQ8A* x, const float* xd, int64_t nb, float (&res)[NR],
                      const char* pf, int64_t pf_bytes) {
  using P = WeightBlock<WT>;
  constexpr int K = P::kPieces;
  __m256 acc[NR];
  float off[NR];
  for (int r = 0; r < NR; ++r) { acc[r] = _mm256_setzero_ps(); off[r] = 0.f; }
  typename P::Cache cache[NR]{};  // (zeroed: the row-lane path below never fills it, and reads none of it)
  // Q4_K and Q5_K in tiles of 4 rows: scales and offsets are unpacked for the four rows at once, and the offsets of
  // the four rows are the lanes of one vector, each lane the same FMA chain as a row's scalar one (the bits do not
  // change), one instruction a piece instead of eight.
  constexpr bool kRowLanes = K == 8 && P::kOffset && NR == 4;
  __m128 off4 = _mm_setzero_ps();
  for (int64_t sb = 0; sb < nb / K; ++sb) {
    const int64_t b0 = sb * K;  // so that b0 + j splits into super-block and piece at compile time
    if (pf)
      for (int64_t o = 0; o < pf_bytes; o += 64) _mm_prefetch(pf + sb * pf_bytes + o, _MM_HINT_T1);
    alignas(32) float sv[NR * K];       // scale products d_w * d_x: [row][piece], or [piece][row] for row lanes
    alignas(32) float mins[kRowLanes ? 4 * K : 1];  // [piece][row]
    if constexpr (kRowLanes) {
      P::prepare_rows4(wrows, sb, xd + b0, sv, mins);
    } else if constexpr (K == 8) {
      const __m256 dx = _mm256_loadu_ps(xd + b0);
      for (int r = 0; r < NR; ++r) {
        P::prepare(wrows[r], sb, cache[r]);
        _mm256_store_ps(sv + r * K, _mm256_mul_ps(P::scales(cache[r]), dx));
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < K; ++j) {
      const int64_t b = b0 + j;
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
      for (int r = 0; r < NR; ++r) {
        Piece w;
        P::load(wrows[r], b, cache[r], w);
        const __m256 p = _mm256_cvtepi32_ps(piece_dot<P>(w, xq));
        const __m256 scale = K == 1 ? _mm256_set1_ps(w.d * xd[b])
                             : _mm256_broadcast_ss(kRowLanes ? &sv[j * NR + r] : &sv[r * K + j]);
        acc[r] = _mm256_fmadd_ps(p, scale, acc[r]);
        if (P::kOffset && !kRowLanes) off[r] = std::fma(w.m, x[b].s, off[r]);
      }
      if constexpr (kRowLanes)
        off4 = _mm_fmadd_ps(_mm_load_ps(&mins[4 * j]), _mm_set1_ps(x[b].s), off4);
    }
  }
  if constexpr (kRowLanes) _mm_storeu_ps(off, off4);
  for (int r = 0; r < NR; ++r) res[r] = hsum(acc[r]) + off[r];
}

// Blocks per row whose token scales fit the stack (a row of 16,384 elements); the decoded path never has
// more (its 48 KiB of decoded pieces hold at least two rows), longer rows take tile() when not decoded.
constexpr int64_t kMaxScaleBlocks = 512;
// Decode copies the activation's scales to the stack for rows of up to 65,536 elements; longer ones take tile().
constexpr int64_t kMaxDecodeBlocks = 2048;

// Decode rows [r, r1) of one token (row t0 of the activation) in tiles of NR rows (gemv_tile).
template <DType WT, int NR, typename RowOf>
void gemv_rows(const MatMulArgs& a, RowOf row, int64_t r, int64_t r0, int64_t r1, int64_t t0, const BlockQ8A* const* xr,
               int64_t nb) {
  int64_t ahead = r0 + NR;
  float xd[kMaxDecodeBlocks];
  for (int64_t b = 0; b < nb; ++b) xd[b] = xr[0][b].d;
  // Contiguous rows (no gather list, no pages): one stream, prefetched a fixed distance ahead in bytes.
  const bool stream = !a.row_ids && !a.w_rows;
  const int64_t pieces = nb / WeightBlock<WT>::kPieces, tile_bytes = NR * int64_t(a.w_row_bytes);
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
    gemv_tile<WT, NR>(wr, xr[0], xd, nb, res, pf_step ? pf_next : nullptr, pf_step);
    pf_next += pf_step * pieces;
    for (int i = 0; i < NR; ++i) a.dst[t0 * a.ldd + row(r + i)] = res[i];
  }
  for (; r < r1; ++r) {
    const uint8_t* wr[1] = {a.row(row(r))};
    float res[1];
    gemv_tile<WT, 1>(wr, xr[0], xd, nb, res, nullptr, 0);
    a.dst[t0 * a.ldd + row(r)] = res[0];
  }
}

template <DType WT, int NR, int NT>
void rows_for_tokens(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0) {
  const int64_t nb = a.k / kQuantBlock;
  const BlockQ8A* xr[NT];
  for (int t = 0; t < NT; ++t)
    xr[t] = reinterpret_cast<const BlockQ8A*>(static_cast<const uint8_t*>(a.x) + (t0 + t) * a.x_row_bytes);
  auto row = [&](int64_t i) -> int64_t { return a.row_ids ? a.row_ids[i] : i; };
  TokenScales xs[NT > 1 ? kMaxScaleBlocks : 1];
  if constexpr (NT > 1)
    if (nb <= kMaxScaleBlocks) token_scales<NT>(xr[0], int32_t(a.x_row_bytes), nb, xs);
  int64_t r = r0;
  int64_t ahead = r0 + NR;  // decode: the first row not yet prefetched (the first tile is loaded on demand)
  if constexpr (NT == 1) {
    if (nb <= kMaxDecodeBlocks && nb % WeightBlock<WT>::kPieces == 0) {
      return gemv_rows<WT, NR>(a, row, r, r0, r1, t0, xr, nb);
    }
  }
  for (; r + NR <= r1; r += NR) {
    const uint8_t* wr[NR];
    for (int i = 0; i < NR; ++i) wr[i] = a.row(row(r + i));
    if (NT == 1) prefetch_rows_ahead<NR>(a, row, ahead, std::min(r + kAheadRows + NR, r1));  // x86_common.h
    float res[NR][NT];
    if constexpr (NT > 1) {
      if (nb <= kMaxScaleBlocks)
        tile_tokens<WeightBlock<WT>, NR, NT>(wr, xr[0], int32_t(a.x_row_bytes), nb, xs, res);
      else
        tile<WT, NR, NT>(wr, xr, nb, res);
    } else {
      tile<WT, NR, NT>(wr, xr, nb, res);
    }
    for (int i = 0; i < NR; ++i)
      for (int t = 0; t < NT; ++t) a.dst[(t0 + t) * a.ldd + row(r + i)] = res[i][t];
  }
  for (; r < r1; ++r) {
    const uint8_t* wr[1] = {a.row(row(r))};
    float res[1][NT];
    tile<WT, 1, NT>(wr, xr, nb, res);
    for (int t = 0; t < NT; ++t) a.dst[(t0 + t) * a.ldd + row(r)] = res[0][t];
  }
}

// Tile shapes: rows x 1 token for decode, rows x tokens for prefill; an ISA with 32 vector registers
// (AVX-512VL) holds bigger tiles. Decode takes 4 rows a tile on both x86 tables since its weights stream through
// gemv_tile's byte-distance prefetch (adjacent rows are one stream, not four): on a 2-core Zen 4 VM, 16 decode
// steps of the Qwen2.5-1.5B-shaped Q4_K_M file (bench/real_shapes.py) took 0.65 s with 4 rows, 0.75-0.76 with 2
// and 0.78-0.82 with 8 on AVX-512; the AVX2 table on the same CPU 0.70 s with 4, 0.72-0.73 with 2, 0.84 with 1.
// (Before that prefetch, 2 rows were best on Zen 4 and 1 row on a Zen 3 VM, AVX2 only: each row was a stream.)
// Float weights (F16, BF16, F32: matmul_float_x86.h) have no gemv_tile and keep the row-distance prefetch, so they
// keep the decode rows measured for it (kFloatDecodeRows).
template <int kDecodeRows, int kRows, int kTokens, int kFloatDecodeRows>
struct TileShape {
  static constexpr int decode_rows = kDecodeRows, rows = kRows, tokens = kTokens, float_decode_rows = kFloatDecodeRows;
};

// Prefill decodes each weight piece once per row chunk into plain bytes (q, d, m), then every token tile of
// the run reads those instead of decoding the packed blocks again: the decode (shuffles and masks for
// Q5_0, nibble splits, fp16 scales) was about half the instructions per (row, token) pair.
struct DecodedPiece {
  int8_t q[32];
  float d, m;
  int16_t sc[2];  // Q6_K's scales of elements 0..15 and 16..31
};

template <typename Source>
struct DecodedBlock : OnePiecePerBlock {
  static constexpr bool kOffset = Source::kOffset;  // Q8_0, Q6_K: no offset to gather and accumulate
  static constexpr bool kSigned = Source::kSigned;
  static constexpr bool kSubScales = Source::kSubScales;
  static void load(const uint8_t* row, int64_t b, const Cache&, Piece& p) {
    const DecodedPiece& dp = reinterpret_cast<const DecodedPiece*>(row)[b];
    p.q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dp.q));
    if (kSubScales) p.sc16 = _mm256_setr_m128i(_mm_set1_epi16(dp.sc[0]), _mm_set1_epi16(dp.sc[1]));
    p.d = dp.d;
    p.m = dp.m;
  }
};

// Rows [c0, c1) decoded to `out` (row i - c0 at out + (i - c0) * nb).
template <DType WT>
void decode_rows(const MatMulArgs& a, int64_t c0, int64_t c1, int64_t nb, DecodedPiece* out) {
  using P = WeightBlock<WT>;
  for (int64_t i = c0; i < c1; ++i) {
    const uint8_t* w = a.row(a.row_ids ? a.row_ids[i] : i);
    typename P::Cache cache;
    DecodedPiece* o = out + (i - c0) * nb;
    for (int64_t b = 0; b < nb; ++b) {
      if (b % P::kPieces == 0) P::prepare(w, b / P::kPieces, cache);
      Piece p;
      P::load(w, b, cache, p);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o[b].q), p.q);
      o[b].d = p.d;
      o[b].m = p.m;
      if (P::kSubScales) {
        o[b].sc[0] = int16_t(_mm256_extract_epi16(p.sc16, 0));
        o[b].sc[1] = int16_t(_mm256_extract_epi16(p.sc16, 8));
      }
    }
  }
}

template <DType WT, int NR, int NT>
void decoded_rows_for_tokens(const MatMulArgs& a, const DecodedPiece* chunk, int64_t c0, int64_t c1, int64_t nb,
                             int64_t t0) {
  using D = DecodedBlock<WeightBlock<WT>>;
  const auto* x0 = reinterpret_cast<const BlockQ8A*>(static_cast<const uint8_t*>(a.x) + t0 * a.x_row_bytes);
  auto row = [&](int64_t i) -> int64_t { return a.row_ids ? a.row_ids[i] : i; };
  TokenScales xs[kMaxScaleBlocks];
  token_scales<NT>(x0, int32_t(a.x_row_bytes), nb, xs);
  int64_t r = c0;
  for (; r < c1; r += NR) {
    const int nr = int(c1 - r < NR ? c1 - r : NR);
    const uint8_t* wr[NR];
    for (int i = 0; i < NR; ++i)  // a short last tile repeats its last row and drops the copies
      wr[i] = reinterpret_cast<const uint8_t*>(chunk + (r + (i < nr ? i : nr - 1) - c0) * nb);
    float res[NR][NT];
    tile_tokens<D, NR, NT>(wr, x0, int32_t(a.x_row_bytes), nb, xs, res);
    for (int i = 0; i < nr; ++i)
      for (int t = 0; t < NT; ++t) a.dst[(t0 + t) * a.ldd + row(r + i)] = res[i][t];
  }
}

template <DType WT, typename S>
void matmul_typed(const MatMulArgs& a) {
  if (a.n_tok == 1) return rows_for_tokens<WT, S::decode_rows, 1>(a, a.r0, a.r1, 0);
  const int64_t nb = a.k / kQuantBlock;
  // Row chunks outer so a chunk of weights stays in L1/L2 while every token tile passes over it.
  constexpr int64_t kRowChunk = 64;
  // 160 KiB on the stack (within L2): 8 rows of an 8,960-element ffn_down, where 48 KiB held fewer rows than a tile
  // and sent those matrices down the path that unpacks each block once per token tile (256 tokens, 2 threads, Zen 4:
  // Q4_K 1536 x 8960 87 -> 119 GMAC/s, Q6_K 63 -> 76, Q4_K 4096 x 12288 99 -> 116; 256 KiB gained 1-4% more).
  constexpr int64_t kDecodedPieces = (160 << 10) / sizeof(DecodedPiece);
  const int64_t decoded_rows = nb > 0 ? kDecodedPieces / nb : 0;
  if (a.n_tok >= 2 * S::tokens && decoded_rows >= S::rows && nb <= kMaxScaleBlocks) {
    DecodedPiece chunk[kDecodedPieces];
    const int64_t rows = decoded_rows < kRowChunk ? decoded_rows - decoded_rows % S::rows : kRowChunk;
    for (int64_t c0 = a.r0; c0 < a.r1; c0 += rows) {
      const int64_t c1 = c0 + rows < a.r1 ? c0 + rows : a.r1;
      decode_rows<WT>(a, c0, c1, nb, chunk);
      int64_t t = 0;
      for (; t + S::tokens <= a.n_tok; t += S::tokens)
        decoded_rows_for_tokens<WT, S::rows, S::tokens>(a, chunk, c0, c1, nb, t);
      for (; t + 2 <= a.n_tok; t += 2) decoded_rows_for_tokens<WT, S::rows, 2>(a, chunk, c0, c1, nb, t);
      if (t < a.n_tok) rows_for_tokens<WT, S::rows, 1>(a, c0, c1, t);
    }
    return;
  }
  for (int64_t c0 = a.r0; c0 < a.r1; c0 += kRowChunk) {
    const int64_t c1 = c0 + kRowChunk < a.r1 ? c0 + kRowChunk : a.r1;
    int64_t t = 0;
    for (; t + S::tokens <= a.n_tok; t += S::tokens) rows_for_tokens<WT, S::rows, S::tokens>(a, c0, c1, t);
    for (; t + 2 <= a.n_tok; t += 2) rows_for_tokens<WT, S::rows, 2>(a, c0, c1, t);
    if (t < a.n_tok) rows_for_tokens<WT, S::rows, 1>(a, c0, c1, t);
  }
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
    default:
      if (!float_matmul_x86<S>(a)) matmul_float_weights(a);
  }
}

}  // namespace
}  // namespace pyinfer
