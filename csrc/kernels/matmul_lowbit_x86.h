// The low-bit weight types' pieces for the x86 matmuls (Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4 and the IQ2/IQ3 grid
// types of MoE quants), included by matmul_x86.h after its Piece and WeightBlock: each fills a Piece exactly as the
// portable decoder (quant_blocks.cpp) fills a Piece32, so the tiles and prefill's lanes sum the same integers and
// the same float steps as the scalar reference. Signed bytes throughout; a super-block's scales are unpacked once
// for its eight pieces (prepare). Decode takes the generic 4-row tiles (gemv_tile4 reads the legacy and K-quant
// blocks' scales itself).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/iq_tables.h"
#include "kernels/kquant_scales.h"

namespace pyinfer {
namespace {

// 32 signed bytes from 16 bytes of nibble pairs (GGML order) through a 16-entry table, one shuffle per lane.
inline __m256i lut_nibbles(const uint8_t* qs, const int8_t* table) {
  const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)));
  return _mm256_shuffle_epi8(t, unpack_nibbles(qs));
}

// q with element i negated where bit i % 8 of byte i / 8 of `signs` is set.
inline __m256i apply_signs(__m256i q, uint32_t signs) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(signs)), _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
  const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_sub_epi8(_mm256_xor_si256(q, neg), neg);
}

inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
template <int kRows>
inline long long grid8(const IqGrid<kRows, 8>& g, int i) {
  long long v;
  std::memcpy(&v, g.v[i], 8);
  return v;
}
template <int kRows>
inline int grid4(const IqGrid<kRows, 4>& g, int i) {
  int v;
  std::memcpy(&v, g.v[i], 4);
  return v;
}
// Two 16-element halves' scales (sub-scale types) as Piece::sc16 lays them out.
inline __m256i half_scales(int s0, int s1) { return _mm256_setr_m128i(_mm_set1_epi16(short(s0)), _mm_set1_epi16(short(s1))); }

// A super-block's 16 sub-block scales widened to int16 once (0..7 in both 128-bit halves of lo, 8..15 of hi, as
// Q6_K's), so piece j's pair 2j, 2j + 1 is one byte shuffle instead of two broadcasts and an insert.
struct SixteenScales {
  __m256i lo, hi;
  void set(__m128i s8, bool is_signed) {
    const __m256i s16 = is_signed ? _mm256_cvtepi8_epi16(s8) : _mm256_cvtepu8_epi16(s8);
    lo = _mm256_permute4x64_epi64(s16, 0x44);
    hi = _mm256_permute4x64_epi64(s16, 0xee);
  }
  __m256i pair(int j) const {
    const int g = j % 4;
    const char e0 = char(4 * g), e1 = char(4 * g + 1), o0 = char(4 * g + 2), o1 = char(4 * g + 3);
    const __m256i pick = _mm256_setr_epi8(e0, e1, e0, e1, e0, e1, e0, e1, e0, e1, e0, e1, e0, e1, e0, e1,
                                          o0, o1, o0, o1, o0, o1, o0, o1, o0, o1, o0, o1, o0, o1, o0, o1);
    return _mm256_shuffle_epi8(j / 4 ? hi : lo, pick);
  }
};

struct SignedPieces {
  static constexpr bool kSigned = true;
  static constexpr bool kOffset = false;
  static constexpr bool kHalfMins = false;
};

// ---- one block, one piece: a table of 16 values and a scale ----------------------------------------------
template <> struct WeightBlock<DType::IQ4_NL> : OnePiecePerBlock, SignedPieces {
  using SignedPieces::kOffset;
  static constexpr bool kSubScales = false;
  static void load(const uint8_t* row, int64_t b, const Cache&, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockIQ4_NL*>(row)[b];
    p.q = lut_nibbles(blk.qs, kIq4Values);
    p.d = _cvtsh_ss(blk.d) * 1.f;
    p.m = 0.f;
  }
};
template <> struct WeightBlock<DType::MXFP4> : OnePiecePerBlock, SignedPieces {
  using SignedPieces::kOffset;
  static constexpr bool kSubScales = false;
  static void load(const uint8_t* row, int64_t b, const Cache&, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockMXFP4*>(row)[b];
    p.q = lut_nibbles(blk.qs, kMxfp4Values);
    p.d = e8m0_half(blk.e) * 1.f;
    p.m = 0.f;
  }
};

// ---- super-blocks of 8 pieces ------------------------------------------------------------------------------
struct EightPieces : SignedPieces {
  static constexpr int kPieces = 8;
};

template <> struct WeightBlock<DType::IQ4_XS> : EightPieces {
  static constexpr bool kSubScales = false;
  struct Cache { float d[8]; };
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) {
    const auto& blk = reinterpret_cast<const BlockIQ4_XS*>(row)[sb];
    const float d = _cvtsh_ss(blk.d);
    for (int j = 0; j < 8; ++j)
      c.d[j] = d * float((((blk.scales_l[j / 2] >> (4 * (j % 2))) & 0x0f) | (((blk.scales_h >> (2 * j)) & 3) << 4)) - 32);
  }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    p.q = lut_nibbles(reinterpret_cast<const BlockIQ4_XS*>(row)[b / 8].qs + 16 * (b % 8), kIq4Values);
    p.d = c.d[b % 8];
    p.m = 0.f;
  }
};

// Q3_K: 2 bits of qs[32 * half ..] at bit 2g, minus 4 where the piece's bit j of hmask is clear; 16 scales.
template <> struct WeightBlock<DType::Q3_K> : EightPieces {
  static constexpr bool kSubScales = true;
  struct Cache { float d; SixteenScales sc; };
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) {
    const auto& blk = reinterpret_cast<const BlockQ3_K*>(row)[sb];
    c.d = _cvtsh_ss(blk.d);
    alignas(16) int8_t sc[16];
    unpack_q3k_scales(blk.scales, sc);
    c.sc.set(_mm_load_si128(reinterpret_cast<const __m128i*>(sc)), true);
  }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ3_K*>(row)[b / 8];
    const int j = int(b % 8), half = j / 4, g = j % 4;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * half));
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.hmask));
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(j)), _mm256_set1_epi8(1));
    p.q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 2)), _mm256_set1_epi8(4));
    p.sc16 = c.sc.pair(j);
    p.d = c.d;
    p.m = 0.f;
  }
};

// Q2_K: 2 bits of qs[32 * half ..] at bit 2g (unsigned: no sign moves onto the activation); a 4-bit scale and min
// per 16 elements (the mins: kHalfMins, integers against the halves' activation sums).
template <> struct WeightBlock<DType::Q2_K> : EightPieces {
  static constexpr bool kSigned = false;
  static constexpr bool kSubScales = true;
  static constexpr bool kHalfMins = true;
  struct Cache { float d, m; SixteenScales sc; };
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) {
    const auto& blk = reinterpret_cast<const BlockQ2_K*>(row)[sb];
    c.d = _cvtsh_ss(blk.d);
    c.m = -_cvtsh_ss(blk.dmin);
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales));
    c.sc.set(_mm_and_si128(s, _mm_set1_epi8(0x0f)), false);
  }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ2_K*>(row)[b / 8];
    const int j = int(b % 8), half = j / 4, g = j % 4;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * half));
    p.q = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
    p.sc16 = c.sc.pair(j);
    p.mins[0] = blk.scales[2 * j] >> 4;
    p.mins[1] = blk.scales[2 * j + 1] >> 4;
    p.d = c.d;
    p.m = c.m;
  }
};

// The grid types: 4 rows of 8 magnitudes (IQ2) or 8 rows of 4 (IQ3) per piece, signs applied after. Their scales
// (2 s + 1) times d / 8 (IQ2) or d / 4 (IQ3_XXS), as the portable decoder forms them.
struct GridCache { float d; };
template <> struct WeightBlock<DType::IQ2_XXS> : EightPieces {
  static constexpr bool kSubScales = false;
  using Cache = GridCache;
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) {
    c.d = _cvtsh_ss(reinterpret_cast<const BlockIQ2_XXS*>(row)[sb].d) * 0.125f;
  }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const uint8_t* w = reinterpret_cast<const uint8_t*>(reinterpret_cast<const BlockIQ2_XXS*>(row)[b / 8].qs) + 8 * (b % 8);
    const uint32_t aux = u32_at(w + 4);
    const __m256i q = _mm256_setr_epi64x(grid8(kIq2xxsGrid, w[0]), grid8(kIq2xxsGrid, w[1]), grid8(kIq2xxsGrid, w[2]),
                                         grid8(kIq2xxsGrid, w[3]));
    const uint32_t signs = uint32_t(kIqSigns.v[aux & 127]) | uint32_t(kIqSigns.v[(aux >> 7) & 127]) << 8 |
                           uint32_t(kIqSigns.v[(aux >> 14) & 127]) << 16 | uint32_t(kIqSigns.v[(aux >> 21) & 127]) << 24;
    p.q = apply_signs(q, signs);
    p.d = c.d * float(2 * int(aux >> 28) + 1);
    p.m = 0.f;
  }
};
template <> struct WeightBlock<DType::IQ2_XS> : EightPieces {
  static constexpr bool kSubScales = true;
  using Cache = GridCache;
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) {
    c.d = _cvtsh_ss(reinterpret_cast<const BlockIQ2_XS*>(row)[sb].d) * 0.125f;
  }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockIQ2_XS*>(row)[b / 8];
    const int j = int(b % 8);
    const uint16_t* v = blk.qs + 4 * j;
    const __m256i q = _mm256_setr_epi64x(grid8(kIq2xsGrid, v[0] & 511), grid8(kIq2xsGrid, v[1] & 511),
                                         grid8(kIq2xsGrid, v[2] & 511), grid8(kIq2xsGrid, v[3] & 511));
    const uint32_t signs = uint32_t(kIqSigns.v[v[0] >> 9]) | uint32_t(kIqSigns.v[v[1] >> 9]) << 8 |
                           uint32_t(kIqSigns.v[v[2] >> 9]) << 16 | uint32_t(kIqSigns.v[v[3] >> 9]) << 24;
    p.q = apply_signs(q, signs);
    p.sc16 = half_scales(2 * (blk.scales[j] & 0x0f) + 1, 2 * (blk.scales[j] >> 4) + 1);
    p.d = c.d;
    p.m = 0.f;
  }
};
template <> struct WeightBlock<DType::IQ2_S> : EightPieces {
  static constexpr bool kSubScales = true;
  using Cache = GridCache;
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) {
    c.d = _cvtsh_ss(reinterpret_cast<const BlockIQ2_S*>(row)[sb].d) * 0.125f;
  }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockIQ2_S*>(row)[b / 8];
    const int j = int(b % 8), qh = blk.qh[j];
    const uint8_t* qs = blk.qs + 4 * j;
    auto index = [&](int l) { return qs[l] | ((qh << (8 - 2 * l)) & 0x300); };
    const __m256i q = _mm256_setr_epi64x(grid8(kIq2sGrid, index(0)), grid8(kIq2sGrid, index(1)),
                                         grid8(kIq2sGrid, index(2)), grid8(kIq2sGrid, index(3)));
    p.q = apply_signs(q, u32_at(blk.qs + 32 + 4 * j));
    p.sc16 = half_scales(2 * (blk.scales[j] & 0x0f) + 1, 2 * (blk.scales[j] >> 4) + 1);
    p.d = c.d;
    p.m = 0.f;
  }
};
template <> struct WeightBlock<DType::IQ3_XXS> : EightPieces {
  static constexpr bool kSubScales = false;
  using Cache = GridCache;
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) {
    c.d = _cvtsh_ss(reinterpret_cast<const BlockIQ3_XXS*>(row)[sb].d) * 0.25f;
  }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockIQ3_XXS*>(row)[b / 8];
    const int j = int(b % 8);
    const uint8_t* qs = blk.qs + 8 * j;
    const uint32_t aux = u32_at(blk.qs + 64 + 4 * j);
    const __m256i q = _mm256_setr_epi32(grid4(kIq3xxsGrid, qs[0]), grid4(kIq3xxsGrid, qs[1]), grid4(kIq3xxsGrid, qs[2]),
                                        grid4(kIq3xxsGrid, qs[3]), grid4(kIq3xxsGrid, qs[4]), grid4(kIq3xxsGrid, qs[5]),
                                        grid4(kIq3xxsGrid, qs[6]), grid4(kIq3xxsGrid, qs[7]));
    const uint32_t signs = uint32_t(kIqSigns.v[aux & 127]) | uint32_t(kIqSigns.v[(aux >> 7) & 127]) << 8 |
                           uint32_t(kIqSigns.v[(aux >> 14) & 127]) << 16 | uint32_t(kIqSigns.v[(aux >> 21) & 127]) << 24;
    p.q = apply_signs(q, signs);
    p.d = c.d * float(2 * int(aux >> 28) + 1);
    p.m = 0.f;
  }
};
template <> struct WeightBlock<DType::IQ3_S> : EightPieces {
  static constexpr bool kSubScales = false;
  using Cache = GridCache;
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) {
    c.d = _cvtsh_ss(reinterpret_cast<const BlockIQ3_S*>(row)[sb].d);
  }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockIQ3_S*>(row)[b / 8];
    const int j = int(b % 8), qh = blk.qh[j];
    const uint8_t* qs = blk.qs + 8 * j;
    auto g = [&](int i) { return grid4(kIq3sGrid, qs[i] | ((qh << (8 - i)) & 256)); };  // qh bit i
    const __m256i q = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
    p.q = apply_signs(q, u32_at(blk.signs + 4 * j));
    p.d = c.d * float(1 + 2 * ((blk.scales[j / 2] >> (4 * (j % 2))) & 0x0f));
    p.m = 0.f;
  }
};

}  // namespace
}  // namespace pyinfer
