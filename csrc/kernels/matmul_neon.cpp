// NEON kernels (aarch64, where NEON is baseline). Integer dot via widening multiplies, so no
// dotprod extension is required. Every integer-dot weight type has its own piece decoder here (the 5-bit and
// K-quant ones too: through the portable decode_piece they cost a scalar loop per element), and a piece is
// decoded once for up to four tokens.
#if defined(__aarch64__)
#include <arm_neon.h>

#include <algorithm>
#include <type_traits>
#include <cmath>

#include "kernels/float_weight.h"
#include "kernels/fp16.h"
#include "kernels/iq_tables.h"
#include "kernels/attention.h"
#include "kernels/kquant_scales.h"
#include "kernels/ops_float.h"
#include "kernels/kernels.h"

namespace pyinfer {
namespace {

inline int32_t dot_s8x16(int8x16_t a, int8x16_t b) {
  int32x4_t s = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
  s = vpadalq_s16(s, vmull_s8(vget_high_s8(a), vget_high_s8(b)));
  return vaddvq_s32(s);
}

// One 32-element weight piece: elements 0..15 in lo, 16..31 in hi. Element j is d * sc[j / 16] * q[j] + m
// (sc only for kSubScales types, Q6_K; m multiplies the activation block's s).
struct Piece {
  int8x16_t lo, hi;
  float d, m;
  int32_t sc[2];
  int32_t mins[2];  // Q2_K (kHalfMins): the halves' 4-bit mins, times m = -dmin and the halves' activation sums
};

// 16 packed bytes -> low nibbles (elements 0..15) and high nibbles (16..31), GGML order.
inline void nibbles(const uint8_t* qs, Piece& p) {
  const uint8x16_t q = vld1q_u8(qs);
  p.lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f)));
  p.hi = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
}

// Bit 4 of each of 16 bytes from two mask bytes: byte i takes bit i % 8 of mask byte i / 8.
inline int8x16_t fifth_bits16(uint8_t m0, uint8_t m1) {
  static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t set = vtstq_u8(vcombine_u8(vdup_n_u8(m0), vdup_n_u8(m1)), vld1q_u8(kBit));
  return vreinterpretq_s8_u8(vandq_u8(set, vdupq_n_u8(0x10)));
}

struct OnePiecePerBlock {
  static constexpr int kPieces = 1;
  static constexpr bool kSubScales = false;
  static constexpr bool kOffset = true;  // m != 0
  struct Cache {};
  static void prepare(const uint8_t*, int64_t, Cache&) {}
};

template <DType WT> struct WeightBlock;
// Q4_0, Q4_1, Q5_0, Q5_1: nibbles (plus a fifth bit from qh), a scale, and an offset that is stored (the _1
// types) or minus half the range times the scale (the _0 types: d * (q - 8) = d * q - 8d).
template <typename Block, bool kFifthBit, bool kStoredMin>
struct NibbleBlock : OnePiecePerBlock {
  static void load(const uint8_t* row, int64_t b, const Cache&, Piece& p) {
    const Block& blk = reinterpret_cast<const Block*>(row)[b];
    nibbles(blk.qs, p);
    if constexpr (kFifthBit) {
      p.lo = vorrq_s8(p.lo, fifth_bits16(blk.qh[0], blk.qh[1]));
      p.hi = vorrq_s8(p.hi, fifth_bits16(blk.qh[2], blk.qh[3]));
    }
    p.d = fp16_to_fp32(blk.d);
    if constexpr (kStoredMin)
      p.m = fp16_to_fp32(blk.m);
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
  static void load(const uint8_t* row, int64_t b, const Cache&, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ8_0*>(row)[b];
    p.lo = vld1q_s8(blk.qs);
    p.hi = vld1q_s8(blk.qs + 16);
    p.d = fp16_to_fp32(blk.d);
    p.m = 0.f;
  }
};
// Q4_K and Q5_K: piece j = b % 8 of super-block b / 8, its scale d * sc[j] and offset -dmin * mn[j] decoded
// once per super-block. Nibble pairs: piece 2i takes the low nibbles of qs[32i..32i+31], piece 2i+1 the high.
template <DType WT> struct KQuantBlock {
  static constexpr bool kFive = WT == DType::Q5_K;
  static constexpr size_t kBytes = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  static constexpr int kPieces = 8;
  static constexpr bool kSubScales = false;
  static constexpr bool kOffset = true;
  struct Cache { float d[8], m[8]; };
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) {
    const auto& k4 = *reinterpret_cast<const BlockQ4_K*>(row + sb * kBytes);  // d, dmin, scales: same offsets
    const float d = fp16_to_fp32(k4.d), dmin = fp16_to_fp32(k4.dmin);
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      unpack_kquant_scale_min(k4.scales, j, sc, mn);
      c.d[j] = d * float(sc);
      c.m[j] = -dmin * float(mn);
    }
  }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const int j = int(b % 8);
    const uint8_t* base = row + (b / 8) * kBytes;
    const uint8_t* qs = (kFive ? reinterpret_cast<const BlockQ5_K*>(base)->qs : reinterpret_cast<const BlockQ4_K*>(base)->qs) + 32 * (j / 2);
    uint8x16_t lo = vld1q_u8(qs), hi = vld1q_u8(qs + 16);
    if (j & 1) {
      lo = vshrq_n_u8(lo, 4);
      hi = vshrq_n_u8(hi, 4);
    } else {
      lo = vandq_u8(lo, vdupq_n_u8(0x0f));
      hi = vandq_u8(hi, vdupq_n_u8(0x0f));
    }
    if constexpr (kFive) {  // bit j of qh[l] is element l's fifth bit
      const uint8_t* qh = reinterpret_cast<const BlockQ5_K*>(base)->qh;
      const int8x16_t right = vdupq_n_s8(int8_t(-j));
      const uint8x16_t one = vdupq_n_u8(1);
      lo = vorrq_u8(lo, vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(qh), right), one), 4));
      hi = vorrq_u8(hi, vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(qh + 16), right), one), 4));
    }
    p.lo = vreinterpretq_s8_u8(lo);
    p.hi = vreinterpretq_s8_u8(hi);
    p.d = c.d[j];
    p.m = c.m[j];
  }
};
template <> struct WeightBlock<DType::Q4_K> : KQuantBlock<DType::Q4_K> {};
template <> struct WeightBlock<DType::Q5_K> : KQuantBlock<DType::Q5_K> {};
// Q6_K: piece j takes 32 bytes of ql (a nibble each) and 32 of qh (two bits each), minus 32; elements 0..15
// and 16..31 have their own int8 scales.
template <> struct WeightBlock<DType::Q6_K> {
  static constexpr int kPieces = 8;
  static constexpr bool kSubScales = true;
  static constexpr bool kOffset = false;
  struct Cache { float d; };
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) { c.d = fp16_to_fp32(reinterpret_cast<const BlockQ6_K*>(row)[sb].d); }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockQ6_K*>(row)[b / 8];
    const int j = int(b % 8), half = j / 4, g = j % 4;
    const uint8_t* ql = blk.ql + 64 * half + 32 * (g & 1);
    const uint8_t* qh = blk.qh + 32 * half;
    const int8x16_t lo_shift = vdupq_n_s8(int8_t(-(g >> 1) * 4)), hi_shift = vdupq_n_s8(int8_t(-2 * g));
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m2 = vdupq_n_u8(3);
    const int8x16_t bias = vdupq_n_s8(32);
    for (int h = 0; h < 2; ++h) {
      const uint8x16_t lo = vandq_u8(vshlq_u8(vld1q_u8(ql + 16 * h), lo_shift), m4);
      const uint8x16_t hi = vandq_u8(vshlq_u8(vld1q_u8(qh + 16 * h), hi_shift), m2);
      const int8x16_t q = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(hi, 4))), bias);
      (h ? p.hi : p.lo) = q;
    }
    p.sc[0] = blk.scales[8 * half + 2 * g];
    p.sc[1] = blk.scales[8 * half + 2 * g + 1];
    p.d = c.d;
    p.m = 0.f;
  }
};

// ---- the low-bit types (MoE quants, gpt-oss's MXFP4): signed bytes as the portable decoder forms them -------
struct SignedPieces {
  static constexpr bool kOffset = false;
  static constexpr bool kHalfMins = false;
};
// 16 packed bytes through a 16-entry table: low nibbles to lo (elements 0..15), high to hi (16..31).
inline void lut_nibbles(const uint8_t* qs, const int8_t* table, Piece& p) {
  const int8x16_t t = vld1q_s8(table);
  const uint8x16_t q = vld1q_u8(qs);
  p.lo = vqtbl1q_s8(t, vandq_u8(q, vdupq_n_u8(0x0f)));
  p.hi = vqtbl1q_s8(t, vshrq_n_u8(q, 4));
}
// Eight bytes negated where bit i of `signs` is set (i: the byte's place).
inline int8x8_t signed8(uint8x8_t mag, uint8_t signs) {
  static const uint8_t kBit[8] = {1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x8_t neg = vtst_u8(vdup_n_u8(signs), vld1_u8(kBit));
  const int8x8_t m = vreinterpret_s8_u8(mag);
  return vbsl_s8(neg, vneg_s8(m), m);
}
// Four groups of 8 (IQ2: a grid row each; IQ3: two rows of 4) with their sign bytes, into the piece.
inline void groups8(const uint8x8_t (&mag)[4], const uint8_t (&signs)[4], Piece& p) {
  p.lo = vcombine_s8(signed8(mag[0], signs[0]), signed8(mag[1], signs[1]));
  p.hi = vcombine_s8(signed8(mag[2], signs[2]), signed8(mag[3], signs[3]));
}
inline uint8x8_t grid_pair4(const uint8_t* a, const uint8_t* b) {  // two IQ3 rows of 4 as 8 bytes
  uint32_t v[2];
  __builtin_memcpy(&v[0], a, 4);
  __builtin_memcpy(&v[1], b, 4);
  return vcreate_u8(uint64_t(v[0]) | uint64_t(v[1]) << 32);
}

template <> struct WeightBlock<DType::IQ4_NL> : OnePiecePerBlock, SignedPieces {
  using SignedPieces::kOffset;
  static void load(const uint8_t* row, int64_t b, const Cache&, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockIQ4_NL*>(row)[b];
    lut_nibbles(blk.qs, kIq4Values, p);
    p.d = fp16_to_fp32(blk.d);
    p.m = 0.f;
  }
};
template <> struct WeightBlock<DType::MXFP4> : OnePiecePerBlock, SignedPieces {
  using SignedPieces::kOffset;
  static void load(const uint8_t* row, int64_t b, const Cache&, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockMXFP4*>(row)[b];
    lut_nibbles(blk.qs, kMxfp4Values, p);
    p.d = e8m0_half(blk.e);
    p.m = 0.f;
  }
};
struct EightPieces : SignedPieces {
  static constexpr int kPieces = 8;
};
template <> struct WeightBlock<DType::IQ4_XS> : EightPieces {
  static constexpr bool kSubScales = false;
  struct Cache { float d; };
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) { c.d = fp16_to_fp32(reinterpret_cast<const BlockIQ4_XS*>(row)[sb].d); }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockIQ4_XS*>(row)[b / 8];
    const int j = int(b % 8);
    lut_nibbles(blk.qs + 16 * j, kIq4Values, p);
    p.d = c.d * float((((blk.scales_l[j / 2] >> (4 * (j % 2))) & 0x0f) | (((blk.scales_h >> (2 * j)) & 3) << 4)) - 32);
    p.m = 0.f;
  }
};
// Q3_K / Q2_K: 2 bits of qs[32 * half ..] at bit 2g; Q3_K minus 4 where hmask's bit j is clear.
template <DType WT> struct TwoBitBlock : EightPieces {
  static constexpr bool kSubScales = true;
  static constexpr bool kHalfMins = WT == DType::Q2_K;
  struct Cache { float d, m; int8_t sc[16]; };
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) {
    if constexpr (WT == DType::Q3_K) {
      const auto& blk = reinterpret_cast<const BlockQ3_K*>(row)[sb];
      c.d = fp16_to_fp32(blk.d);
      unpack_q3k_scales(blk.scales, c.sc);
    } else {
      const auto& blk = reinterpret_cast<const BlockQ2_K*>(row)[sb];
      c.d = fp16_to_fp32(blk.d);
      c.m = -fp16_to_fp32(blk.dmin);
    }
  }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const int j = int(b % 8), half = j / 4, g = j % 4;
    const uint8_t* qs = WT == DType::Q3_K ? reinterpret_cast<const BlockQ3_K*>(row)[b / 8].qs
                                          : reinterpret_cast<const BlockQ2_K*>(row)[b / 8].qs;
    const int8x16_t shift = vdupq_n_s8(int8_t(-2 * g));
    for (int h = 0; h < 2; ++h) {
      const uint8x16_t q = vandq_u8(vshlq_u8(vld1q_u8(qs + 32 * half + 16 * h), shift), vdupq_n_u8(3));
      int8x16_t v = vreinterpretq_s8_u8(q);
      if constexpr (WT == DType::Q3_K) {  // minus 4 where the high bit is clear
        const uint8_t* hm = reinterpret_cast<const BlockQ3_K*>(row)[b / 8].hmask + 16 * h;
        const uint8x16_t set = vtstq_u8(vld1q_u8(hm), vdupq_n_u8(uint8_t(1 << j)));
        v = vsubq_s8(v, vreinterpretq_s8_u8(vbicq_u8(vdupq_n_u8(4), set)));
      }
      (h ? p.hi : p.lo) = v;
    }
    if constexpr (WT == DType::Q3_K) {
      p.sc[0] = c.sc[2 * j];
      p.sc[1] = c.sc[2 * j + 1];
      p.m = 0.f;
    } else {
      const auto& blk = reinterpret_cast<const BlockQ2_K*>(row)[b / 8];
      for (int h = 0; h < 2; ++h) {
        p.sc[h] = blk.scales[2 * j + h] & 0x0f;
        p.mins[h] = blk.scales[2 * j + h] >> 4;
      }
      p.m = c.m;
    }
    p.d = c.d;
  }
};
template <> struct WeightBlock<DType::Q3_K> : TwoBitBlock<DType::Q3_K> {};
template <> struct WeightBlock<DType::Q2_K> : TwoBitBlock<DType::Q2_K> {};

struct GridCache { float d; };
template <> struct WeightBlock<DType::IQ2_XXS> : EightPieces {
  static constexpr bool kSubScales = false;
  using Cache = GridCache;
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) { c.d = fp16_to_fp32(reinterpret_cast<const BlockIQ2_XXS*>(row)[sb].d) * 0.125f; }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const uint8_t* w = reinterpret_cast<const uint8_t*>(reinterpret_cast<const BlockIQ2_XXS*>(row)[b / 8].qs) + 8 * (b % 8);
    uint32_t aux;
    __builtin_memcpy(&aux, w + 4, 4);
    const uint8x8_t mag[4] = {vld1_u8(kIq2xxsGrid.v[w[0]]), vld1_u8(kIq2xxsGrid.v[w[1]]), vld1_u8(kIq2xxsGrid.v[w[2]]),
                              vld1_u8(kIq2xxsGrid.v[w[3]])};
    const uint8_t signs[4] = {kIqSigns.v[aux & 127], kIqSigns.v[(aux >> 7) & 127], kIqSigns.v[(aux >> 14) & 127],
                              kIqSigns.v[(aux >> 21) & 127]};
    groups8(mag, signs, p);
    p.d = c.d * float(2 * int(aux >> 28) + 1);
    p.m = 0.f;
  }
};
template <> struct WeightBlock<DType::IQ2_XS> : EightPieces {
  static constexpr bool kSubScales = true;
  using Cache = GridCache;
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) { c.d = fp16_to_fp32(reinterpret_cast<const BlockIQ2_XS*>(row)[sb].d) * 0.125f; }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockIQ2_XS*>(row)[b / 8];
    const int j = int(b % 8);
    const uint16_t* v = blk.qs + 4 * j;
    const uint8x8_t mag[4] = {vld1_u8(kIq2xsGrid.v[v[0] & 511]), vld1_u8(kIq2xsGrid.v[v[1] & 511]),
                              vld1_u8(kIq2xsGrid.v[v[2] & 511]), vld1_u8(kIq2xsGrid.v[v[3] & 511])};
    const uint8_t signs[4] = {kIqSigns.v[v[0] >> 9], kIqSigns.v[v[1] >> 9], kIqSigns.v[v[2] >> 9], kIqSigns.v[v[3] >> 9]};
    groups8(mag, signs, p);
    p.sc[0] = 2 * (blk.scales[j] & 0x0f) + 1;
    p.sc[1] = 2 * (blk.scales[j] >> 4) + 1;
    p.d = c.d;
    p.m = 0.f;
  }
};
template <> struct WeightBlock<DType::IQ2_S> : EightPieces {
  static constexpr bool kSubScales = true;
  using Cache = GridCache;
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) { c.d = fp16_to_fp32(reinterpret_cast<const BlockIQ2_S*>(row)[sb].d) * 0.125f; }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockIQ2_S*>(row)[b / 8];
    const int j = int(b % 8), qh = blk.qh[j];
    const uint8_t* qs = blk.qs + 4 * j;
    uint8x8_t mag[4];
    uint8_t signs[4];
    for (int l = 0; l < 4; ++l) {
      mag[l] = vld1_u8(kIq2sGrid.v[qs[l] | ((qh << (8 - 2 * l)) & 0x300)]);
      signs[l] = blk.qs[32 + 4 * j + l];
    }
    groups8(mag, signs, p);
    p.sc[0] = 2 * (blk.scales[j] & 0x0f) + 1;
    p.sc[1] = 2 * (blk.scales[j] >> 4) + 1;
    p.d = c.d;
    p.m = 0.f;
  }
};
template <> struct WeightBlock<DType::IQ3_XXS> : EightPieces {
  static constexpr bool kSubScales = false;
  using Cache = GridCache;
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) { c.d = fp16_to_fp32(reinterpret_cast<const BlockIQ3_XXS*>(row)[sb].d) * 0.25f; }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockIQ3_XXS*>(row)[b / 8];
    const int j = int(b % 8);
    const uint8_t* qs = blk.qs + 8 * j;
    uint32_t aux;
    __builtin_memcpy(&aux, blk.qs + 64 + 4 * j, 4);
    uint8x8_t mag[4];
    uint8_t signs[4];
    for (int l = 0; l < 4; ++l) {
      mag[l] = grid_pair4(kIq3xxsGrid.v[qs[2 * l]], kIq3xxsGrid.v[qs[2 * l + 1]]);
      signs[l] = kIqSigns.v[(aux >> (7 * l)) & 127];
    }
    groups8(mag, signs, p);
    p.d = c.d * float(2 * int(aux >> 28) + 1);
    p.m = 0.f;
  }
};
template <> struct WeightBlock<DType::IQ3_S> : EightPieces {
  static constexpr bool kSubScales = false;
  using Cache = GridCache;
  static void prepare(const uint8_t* row, int64_t sb, Cache& c) { c.d = fp16_to_fp32(reinterpret_cast<const BlockIQ3_S*>(row)[sb].d); }
  static void load(const uint8_t* row, int64_t b, const Cache& c, Piece& p) {
    const auto& blk = reinterpret_cast<const BlockIQ3_S*>(row)[b / 8];
    const int j = int(b % 8), qh = blk.qh[j];
    const uint8_t* qs = blk.qs + 8 * j;
    uint8x8_t mag[4];
    uint8_t signs[4];
    for (int l = 0; l < 4; ++l) {
      mag[l] = grid_pair4(kIq3sGrid.v[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)],
                          kIq3sGrid.v[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)]);
      signs[l] = blk.signs[4 * j + l];
    }
    groups8(mag, signs, p);
    p.d = c.d * float(1 + 2 * ((blk.scales[j / 2] >> (4 * (j % 2))) & 0x0f));
    p.m = 0.f;
  }
};

template <typename P, typename = void> struct HasHalfMins { static constexpr bool value = false; };
template <typename P> struct HasHalfMins<P, std::void_t<decltype(P::kHalfMins)>> { static constexpr bool value = P::kHalfMins; };

// A piece against one activation block: d * dx * (integer dot, per half scaled for Q6_K) + m * s (Q2_K: m * dx
// times its mins against the halves' activation sums).
template <typename P>
inline float piece_dot(const Piece& w, const BlockQ8A& x) {
  const int8x16_t xl = vld1q_s8(x.qs), xh = vld1q_s8(x.qs + 16);
  const int32_t lo = dot_s8x16(w.lo, xl), hi = dot_s8x16(w.hi, xh);
  const int32_t i = P::kSubScales ? w.sc[0] * lo + w.sc[1] * hi : lo + hi;
  const float v = w.d * x.d * float(i);
  if constexpr (HasHalfMins<P>::value) {
    const int32_t mins = w.mins[0] * vaddlvq_s8(xl) + w.mins[1] * vaddlvq_s8(xh);
    return v + w.m * x.d * float(mins);
  }
  return P::kOffset ? v + w.m * x.s : v;  // Q8_0 and Q6_K have no offset: no product with s per block
}


// Rows r0..r1 (or row_ids) against the tokens, up to kTokens at a time: each piece is decoded once for them.
template <DType WT>
void matmul_typed(const MatMulArgs& a) {
  using P = WeightBlock<WT>;
  constexpr int64_t kTokens = 4;
  const int64_t nb = a.k / kQuantBlock;
  for (int64_t t0 = 0; t0 < a.n_tok; t0 += kTokens) {
    const int64_t nt = std::min(kTokens, a.n_tok - t0);
    const BlockQ8A* x[kTokens];
    for (int64_t t = 0; t < nt; ++t)
      x[t] = reinterpret_cast<const BlockQ8A*>(static_cast<const uint8_t*>(a.x) + (t0 + t) * a.x_row_bytes);
    for (int64_t i = a.r0; i < a.r1; ++i) {
      const int64_t r = a.row_ids ? a.row_ids[i] : i;
      const uint8_t* w = a.row(r);
      float sum[kTokens] = {0.f, 0.f, 0.f, 0.f};
      typename P::Cache cache;
      for (int64_t b = 0; b < nb; ++b) {
        if (b % P::kPieces == 0) P::prepare(w, b / P::kPieces, cache);
        Piece p;
        P::load(w, b, cache, p);
        for (int64_t t = 0; t < nt; ++t) sum[t] += piece_dot<P>(p, x[t][b]);
      }
      for (int64_t t = 0; t < nt; ++t) a.dst[(t0 + t) * a.ldd + r] = sum[t];
    }
  }
}

// Float weights (F32, F16, BF16), as matmul_float_x86.h: widened 4 at a time to F32, a tile of rows x tokens
// with one accumulator per pair so a weight vector is loaded once for every token of the tile.
template <DType WT>
inline float32x4_t load_f32x4(const uint8_t* row, int64_t i) {
  if constexpr (WT == DType::F32) {
    return vld1q_f32(reinterpret_cast<const float*>(row) + i);
  } else {
    const uint16x4_t h = vld1_u16(reinterpret_cast<const uint16_t*>(row) + i);
    if constexpr (WT == DType::F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));  // BF16: the high half of an F32
  }
}

template <DType WT, int NR, int NT>
void float_rows(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0) {
  const float* xr[NT];
  for (int t = 0; t < NT; ++t)
    xr[t] = reinterpret_cast<const float*>(static_cast<const uint8_t*>(a.x) + (t0 + t) * a.x_row_bytes);
  auto row = [&](int64_t i) -> int64_t { return a.row_ids ? a.row_ids[i] : i; };
  for (int64_t r = r0; r < r1;) {
    const int nr = r + NR <= r1 ? NR : 1;  // the rows past the last full tile go one at a time
    const uint8_t* wr[NR];
    for (int i = 0; i < nr; ++i) wr[i] = a.row(row(r + i));
    float32x4_t acc[NR][NT];
    for (int i = 0; i < NR; ++i)
      for (int t = 0; t < NT; ++t) acc[i][t] = vdupq_n_f32(0.f);
    int64_t j = 0;
    for (; j + 4 <= a.k; j += 4) {
      float32x4_t w[NR];
      for (int i = 0; i < nr; ++i) w[i] = load_f32x4<WT>(wr[i], j);
      for (int t = 0; t < NT; ++t) {
        const float32x4_t x = vld1q_f32(xr[t] + j);
        for (int i = 0; i < nr; ++i) acc[i][t] = vfmaq_f32(acc[i][t], w[i], x);
      }
    }
    for (int i = 0; i < nr; ++i)
      for (int t = 0; t < NT; ++t) {
        float sum = vaddvq_f32(acc[i][t]);
        for (int64_t e = j; e < a.k; ++e) sum += float_weight_at<WT>(wr[i], e) * xr[t][e];
        a.dst[(t0 + t) * a.ldd + row(r + i)] = sum;
      }
    r += nr;
  }
}

template <DType WT>
void float_matmul_typed(const MatMulArgs& a) {
  int64_t t = 0;
  for (; t + 4 <= a.n_tok; t += 4) float_rows<WT, 4, 4>(a, a.r0, a.r1, t);
  for (; t < a.n_tok; ++t) float_rows<WT, 8, 1>(a, a.r0, a.r1, t);  // 8 FMA chains per token, as on x86
}

void matmul_neon(const MatMulArgs& a) {
  switch (a.wtype) {
    case DType::Q4_0: return matmul_typed<DType::Q4_0>(a);
    case DType::Q4_1: return matmul_typed<DType::Q4_1>(a);
    case DType::Q5_0: return matmul_typed<DType::Q5_0>(a);
    case DType::Q5_1: return matmul_typed<DType::Q5_1>(a);
    case DType::Q8_0: return matmul_typed<DType::Q8_0>(a);
    case DType::Q4_K: return matmul_typed<DType::Q4_K>(a);
    case DType::Q5_K: return matmul_typed<DType::Q5_K>(a);
    case DType::Q6_K: return matmul_typed<DType::Q6_K>(a);
    case DType::Q2_K: return matmul_typed<DType::Q2_K>(a);
    case DType::Q3_K: return matmul_typed<DType::Q3_K>(a);
    case DType::IQ4_NL: return matmul_typed<DType::IQ4_NL>(a);
    case DType::IQ4_XS: return matmul_typed<DType::IQ4_XS>(a);
    case DType::MXFP4: return matmul_typed<DType::MXFP4>(a);
    case DType::IQ2_XXS: return matmul_typed<DType::IQ2_XXS>(a);
    case DType::IQ2_XS: return matmul_typed<DType::IQ2_XS>(a);
    case DType::IQ2_S: return matmul_typed<DType::IQ2_S>(a);
    case DType::IQ3_XXS: return matmul_typed<DType::IQ3_XXS>(a);
    case DType::IQ3_S: return matmul_typed<DType::IQ3_S>(a);
    case DType::F32: return float_matmul_typed<DType::F32>(a);
    case DType::F16: return float_matmul_typed<DType::F16>(a);
    case DType::BF16: return float_matmul_typed<DType::BF16>(a);
    default:
      if (!dtype_is_quantized(a.wtype)) return matmul_float_weights(a);
      return matmul_scalar(a);  // any other quantized type: the portable decoder
  }
}

// One block of 32 with multiplier id: q = nearest(x * id) (half to even), y.d = d, y.s = d * sum(q).
inline void quantize_block_neon(const float* xb, float id, float d, BlockQ8A& y) {
  int32_t sum = 0;
  for (int j = 0; j < 8; ++j) {
    const int32x4_t q = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xb + 4 * j), id));  // round half to even
    sum += vaddvq_s32(q);
    const int16x4_t q16 = vmovn_s32(q);
    const int8x8_t q8 = vmovn_s16(vcombine_s16(q16, q16));
    y.qs[4 * j + 0] = vget_lane_s8(q8, 0);
    y.qs[4 * j + 1] = vget_lane_s8(q8, 1);
    y.qs[4 * j + 2] = vget_lane_s8(q8, 2);
    y.qs[4 * j + 3] = vget_lane_s8(q8, 3);
  }
  y.d = d;
  y.s = d * float(sum);
}

inline float abs_max_neon(const float* x, int64_t n) {
  float32x4_t amax = vdupq_n_f32(0.f);
  for (int64_t j = 0; j < n; j += 4) amax = vmaxq_f32(amax, vabsq_f32(vld1q_f32(x + j)));
  return vmaxvq_f32(amax);
}

void quantize_q8a_neon(const float* x, BlockQ8A* y, int64_t n) {
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float* xb = x + b * kQuantBlock;
    const float mx = abs_max_neon(xb, kQuantBlock);
    quantize_block_neon(xb, mx > 0.f ? 127.f / mx : 0.f, mx / 127.f, y[b]);
  }
}

// quantize_q8k_scalar's bits (matmul_scalar.cpp): one multiplier per 256.
void quantize_q8k_neon(const float* x, BlockQ8A* y, int64_t n) {
  constexpr int64_t kPer = kSuperBlock / kQuantBlock;
  for (int64_t sb = 0; sb < n / kSuperBlock; ++sb) {
    const float* xs = x + sb * kSuperBlock;
    const float mx = abs_max_neon(xs, kSuperBlock);
    const float iscale = mx > 0.f ? 127.f / mx : 0.f;
    const bool ok = std::isfinite(iscale) && iscale > 0.f;
    const float d = ok ? 1.f / iscale : 0.f, id = ok ? iscale : 0.f;
    for (int64_t b = 0; b < kPer; ++b) quantize_block_neon(xs + b * kQuantBlock, id, d, y[sb * kPer + b]);
  }
}

float dot_f16_f32_neon(const uint16_t* a, const float* b, int64_t n) {
  float32x4_t acc = vdupq_n_f32(0.f);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    acc = vfmaq_f32(acc, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(a + i))), vld1q_f32(b + i));
  float s = vaddvq_f32(acc);
  for (; i < n; ++i) s += fp16_to_fp32(a[i]) * b[i];
  return s;
}

void axpy_f16_f32_neon(float alpha, const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x + i))), alpha));
  for (; i < n; ++i) y[i] += alpha * fp16_to_fp32(x[i]);
}

void f32_to_f16_neon(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
  for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

// silu_mul_one (ops_float.h), 4 lanes: the same fused steps in the same order, so the same bits.
void silu_mul_neon(const float* gate, const float* up, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t g = vld1q_f32(gate + i);
    const float32x4_t x = vminq_f32(vmaxq_f32(vnegq_f32(g), vdupq_n_f32(kSiluClampLo)), vdupq_n_f32(kSiluClampHi));
    const float32x4_t nf = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(kLog2e)));
    float32x4_t r = vfmaq_f32(x, nf, vdupq_n_f32(-kLn2Hi));
    r = vfmaq_f32(r, nf, vdupq_n_f32(-kLn2Lo));
    float32x4_t p = vdupq_n_f32(kExpC[6]);
    for (int k = 5; k >= 0; --k) p = vfmaq_f32(vdupq_n_f32(kExpC[k]), p, r);
    const float32x4_t scale =
        vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(nf), vdupq_n_s32(127)), 23));
    const float32x4_t den = vfmaq_f32(vdupq_n_f32(1.f), p, scale);
    vst1q_f32(y + i, vmulq_f32(vdivq_f32(g, den), vld1q_f32(up + i)));
  }
  if (i < n) silu_mul_generic(gate + i, up + i, y + i, n - i);
}

}  // namespace

const KernelTable* kernels_neon() {
  static const KernelTable table{"neon", matmul_neon, quantize_q8a_neon, quantize_q8k_neon, dot_f16_f32_neon,
                                 axpy_f16_f32_neon, f32_to_f16_neon, axpy_rows_neon,
                                 attn_tile_neon, kv_to_f32_neon, gelu_mul_generic, silu_mul_neon};
  return &table;
}

}  // namespace pyinfer
#else
#include "kernels/kernels.h"
namespace pyinfer {
const KernelTable* kernels_neon() { return nullptr; }
}  // namespace pyinfer
#endif
