// One decoder of every integer-dot weight type into 32-element pieces, for the CPU reference
// (quant_blocks.cpp: decode_piece) and the CUDA kernels (cuda/kernels/dequant.cuh) alike: the block layouts and
// llama.cpp's tables read once. `Tab` gives fp16 -> fp32 and the value tables and grids where the caller's code runs
// (host arrays, or device copies): Tab::half(bits), Tab::iq4(i), Tab::mxfp4(i), Tab::signs(i), and a grid row's
// magnitudes Tab::iq2xxs(i), iq2xs, iq2s, iq3xxs, iq3s. Each includer instantiates it with a Tab of internal
// linkage, so a SIMD-flagged translation unit never lends its copy to the reference.
#pragma once
#include <cstdint>

#include "graph/dtype.h"
#include "kernels/kquant_scales.h"

namespace pyinfer {

// Element j (0..31) of a 32-element piece is  d * scale[j / 16] * q[j] + m  (Q2_K: + m * mins[j / 16]).
struct Piece32 {
  int8_t q[32];
  int32_t scale[2];  // 1 for the legacy types; sub-block scales (Q6_K, Q3_K, Q2_K, IQ2_XS, IQ2_S: one per 16)
  float d;
  float m;           // offset shared by the piece: Q4_1's m, -8d for Q4_0, -dmin * min for Q4_K/Q5_K; Q2_K: -dmin
  int32_t mins[2];   // Q2_K only: the 4-bit mins of the two halves (the offset differs every 16 elements)
};

namespace piece_detail {

// Low nibbles are elements 0..15 and high nibbles 16..31 (GGML order); qh bit j is element j's fifth bit.
PYINFER_HOST_DEVICE inline void nibbles_and_high_bit(const uint8_t* qs, const uint8_t* qh_bytes, int8_t* q) {
  uint32_t qh = 0;
  if (qh_bytes) qh = uint32_t(qh_bytes[0]) | uint32_t(qh_bytes[1]) << 8 | uint32_t(qh_bytes[2]) << 16 | uint32_t(qh_bytes[3]) << 24;
  for (int j = 0; j < 16; ++j) {
    q[j] = int8_t((qs[j] & 0x0f) | (((qh >> j) & 1) << 4));
    q[j + 16] = int8_t((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
  }
}

// n grid magnitudes with the signs of `signs` (bit k set: element k negative).
PYINFER_HOST_DEVICE inline void signed_grid(const uint8_t* grid, int n, uint8_t signs, int8_t* q) {
  for (int k = 0; k < n; ++k) q[k] = int8_t((signs >> k) & 1 ? -int(grid[k]) : int(grid[k]));
}

// IQ2_XS / IQ2_S: a byte's two 4-bit scales s as the odd integers 2 s + 1, one per half of the piece.
PYINFER_HOST_DEVICE inline void odd_scales(uint8_t packed, Piece32& p) {
  p.scale[0] = 2 * (packed & 0x0f) + 1;
  p.scale[1] = 2 * (packed >> 4) + 1;
}

PYINFER_HOST_DEVICE inline uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

}  // namespace piece_detail

// Decodes piece b (elements 32b .. 32b+31) of a row of `type`. type must be dtype_is_integer_dot.
template <typename Tab>
PYINFER_HOST_DEVICE inline void decode_piece_with(DType type, const uint8_t* row, int64_t b, Piece32& p) {
  p.scale[0] = p.scale[1] = 1;
  p.mins[0] = p.mins[1] = 0;
  p.m = 0.f;
  const int64_t sb = b / 8;  // K-quant super-block and sub-block
  const int j = int(b % 8);
  switch (type) {
    case DType::Q4_0: {
      const auto& blk = reinterpret_cast<const BlockQ4_0*>(row)[b];
      piece_detail::nibbles_and_high_bit(blk.qs, nullptr, p.q);
      p.d = Tab::half(blk.d);
      p.m = -8.f * p.d;
      break;
    }
    case DType::Q4_1: {
      const auto& blk = reinterpret_cast<const BlockQ4_1*>(row)[b];
      piece_detail::nibbles_and_high_bit(blk.qs, nullptr, p.q);
      p.d = Tab::half(blk.d);
      p.m = Tab::half(blk.m);
      break;
    }
    case DType::Q5_0: {
      const auto& blk = reinterpret_cast<const BlockQ5_0*>(row)[b];
      piece_detail::nibbles_and_high_bit(blk.qs, blk.qh, p.q);
      p.d = Tab::half(blk.d);
      p.m = -16.f * p.d;
      break;
    }
    case DType::Q5_1: {
      const auto& blk = reinterpret_cast<const BlockQ5_1*>(row)[b];
      piece_detail::nibbles_and_high_bit(blk.qs, blk.qh, p.q);
      p.d = Tab::half(blk.d);
      p.m = Tab::half(blk.m);
      break;
    }
    case DType::Q8_0: {
      const auto& blk = reinterpret_cast<const BlockQ8_0*>(row)[b];
      for (int l = 0; l < 32; ++l) p.q[l] = blk.qs[l];
      p.d = Tab::half(blk.d);
      break;
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      const bool five = type == DType::Q5_K;
      const uint8_t* base = row + sb * (five ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K));
      const auto& k4 = *reinterpret_cast<const BlockQ4_K*>(base);  // d, dmin and scales share offsets
      const uint8_t* qs = five ? reinterpret_cast<const BlockQ5_K*>(base)->qs : k4.qs;
      const uint8_t* qh = five ? reinterpret_cast<const BlockQ5_K*>(base)->qh : nullptr;
      const int shift = (j & 1) * 4;
      for (int l = 0; l < 32; ++l) {
        int v = (qs[32 * (j / 2) + l] >> shift) & 0x0f;
        if (qh) v |= ((qh[l] >> j) & 1) << 4;
        p.q[l] = int8_t(v);
      }
      int sc, mn;
      unpack_kquant_scale_min(k4.scales, j, sc, mn);
      p.scale[0] = p.scale[1] = sc;
      p.d = Tab::half(k4.d);
      p.m = -Tab::half(k4.dmin) * float(mn);
      break;
    }
    case DType::Q6_K: {
      // Each half of 128 elements: pieces g = 0..3 take ql[32 (g & 1) ..] (low nibbles for g < 2, high
      // after) and bits 2g, 2g+1 of qh[0..31].
      const auto& blk = reinterpret_cast<const BlockQ6_K*>(row)[sb];
      const int half = j / 4, g = j % 4;
      const uint8_t* ql = blk.ql + 64 * half + 32 * (g & 1);
      const uint8_t* qh = blk.qh + 32 * half;
      const int shift = (g >> 1) * 4;
      for (int l = 0; l < 32; ++l)
        p.q[l] = int8_t((((ql[l] >> shift) & 0x0f) | (((qh[l] >> (2 * g)) & 3) << 4)) - 32);
      p.scale[0] = blk.scales[8 * half + 2 * g];
      p.scale[1] = blk.scales[8 * half + 2 * g + 1];
      p.d = Tab::half(blk.d);
      break;
    }
    case DType::Q2_K: {
      // Like Q6_K's pieces: 2 bits of qs[32 * half ..] at bit 2g, one scale and min per 16 elements.
      const auto& blk = reinterpret_cast<const BlockQ2_K*>(row)[sb];
      const int half = j / 4, g = j % 4;
      for (int l = 0; l < 32; ++l) p.q[l] = int8_t((blk.qs[32 * half + l] >> (2 * g)) & 3);
      for (int h = 0; h < 2; ++h) {
        p.scale[h] = blk.scales[2 * j + h] & 0x0f;
        p.mins[h] = blk.scales[2 * j + h] >> 4;
      }
      p.d = Tab::half(blk.d);
      p.m = -Tab::half(blk.dmin);
      break;
    }
    case DType::Q3_K: {
      const auto& blk = reinterpret_cast<const BlockQ3_K*>(row)[sb];
      const int half = j / 4, g = j % 4;
      for (int l = 0; l < 32; ++l)
        p.q[l] = int8_t(((blk.qs[32 * half + l] >> (2 * g)) & 3) - ((blk.hmask[l] >> j) & 1 ? 0 : 4));
      int8_t sc[16];
      unpack_q3k_scales(blk.scales, sc);
      p.scale[0] = sc[2 * j];
      p.scale[1] = sc[2 * j + 1];
      p.d = Tab::half(blk.d);
      break;
    }
    case DType::IQ4_NL:
    case DType::MXFP4: {
      const bool nl = type == DType::IQ4_NL;
      const uint8_t* qs = nl ? reinterpret_cast<const BlockIQ4_NL*>(row)[b].qs : reinterpret_cast<const BlockMXFP4*>(row)[b].qs;
      
      for (int l = 0; l < 16; ++l) {
        p.q[l] = nl ? Tab::iq4(qs[l] & 0x0f) : Tab::mxfp4(qs[l] & 0x0f);
        p.q[l + 16] = nl ? Tab::iq4(qs[l] >> 4) : Tab::mxfp4(qs[l] >> 4);
      }
      p.d = nl ? Tab::half(reinterpret_cast<const BlockIQ4_NL*>(row)[b].d) : e8m0_half(reinterpret_cast<const BlockMXFP4*>(row)[b].e);
      break;
    }
    case DType::IQ4_XS: {
      const auto& blk = reinterpret_cast<const BlockIQ4_XS*>(row)[sb];
      const uint8_t* qs = blk.qs + 16 * j;
      for (int l = 0; l < 16; ++l) {
        p.q[l] = Tab::iq4(qs[l] & 0x0f);
        p.q[l + 16] = Tab::iq4(qs[l] >> 4);
      }
      const int ls = ((blk.scales_l[j / 2] >> (4 * (j % 2))) & 0x0f) | (((blk.scales_h >> (2 * j)) & 3) << 4);
      p.scale[0] = p.scale[1] = ls - 32;
      p.d = Tab::half(blk.d);
      break;
    }
    // The grid types' scales (0.5 + s) / 4 (IQ2) and (0.5 + s) / 2 (IQ3_XXS) are the odd integers 2 s + 1 times
    // d / 8 and d / 4: a power of two, so d * 2^-k is exact and every table keeps integer scales.
    case DType::IQ2_XXS: {
      const auto& blk = reinterpret_cast<const BlockIQ2_XXS*>(row)[sb];
      const uint8_t* w = reinterpret_cast<const uint8_t*>(blk.qs) + 8 * j;
      const uint32_t aux = piece_detail::load_u32(w + 4);
      for (int l = 0; l < 4; ++l) piece_detail::signed_grid(Tab::iq2xxs(w[l]), 8, Tab::signs((aux >> (7 * l)) & 127), p.q + 8 * l);
      p.scale[0] = p.scale[1] = 2 * int(aux >> 28) + 1;
      p.d = Tab::half(blk.d) * 0.125f;
      break;
    }
    case DType::IQ2_XS: {
      const auto& blk = reinterpret_cast<const BlockIQ2_XS*>(row)[sb];
      for (int l = 0; l < 4; ++l) {
        const uint16_t v = blk.qs[4 * j + l];
        piece_detail::signed_grid(Tab::iq2xs(v & 511), 8, Tab::signs(v >> 9), p.q + 8 * l);
      }
      piece_detail::odd_scales(blk.scales[j], p);
      p.d = Tab::half(blk.d) * 0.125f;
      break;
    }
    case DType::IQ2_S: {
      const auto& blk = reinterpret_cast<const BlockIQ2_S*>(row)[sb];
      for (int l = 0; l < 4; ++l) {
        const int index = blk.qs[4 * j + l] | ((blk.qh[j] << (8 - 2 * l)) & 0x300);
        piece_detail::signed_grid(Tab::iq2s(index), 8, blk.qs[32 + 4 * j + l], p.q + 8 * l);
      }
      piece_detail::odd_scales(blk.scales[j], p);
      p.d = Tab::half(blk.d) * 0.125f;
      break;
    }
    case DType::IQ3_XXS: {
      const auto& blk = reinterpret_cast<const BlockIQ3_XXS*>(row)[sb];
      const uint8_t* qs = blk.qs + 8 * j;
      const uint32_t aux = piece_detail::load_u32(blk.qs + 64 + 4 * j);
      for (int l = 0; l < 4; ++l) {
        const uint8_t signs = Tab::signs((aux >> (7 * l)) & 127);
        piece_detail::signed_grid(Tab::iq3xxs(qs[2 * l]), 4, signs, p.q + 8 * l);
        piece_detail::signed_grid(Tab::iq3xxs(qs[2 * l + 1]), 4, uint8_t(signs >> 4), p.q + 8 * l + 4);
      }
      p.scale[0] = p.scale[1] = 2 * int(aux >> 28) + 1;
      p.d = Tab::half(blk.d) * 0.25f;
      break;
    }
    case DType::IQ3_S: {
      const auto& blk = reinterpret_cast<const BlockIQ3_S*>(row)[sb];
      const uint8_t* qs = blk.qs + 8 * j;
      const int qh = blk.qh[j];
      for (int l = 0; l < 4; ++l) {
        const uint8_t signs = blk.signs[4 * j + l];
        piece_detail::signed_grid(Tab::iq3s(qs[2 * l] | ((qh << (8 - 2 * l)) & 256)), 4, signs, p.q + 8 * l);
        piece_detail::signed_grid(Tab::iq3s(qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)), 4, uint8_t(signs >> 4), p.q + 8 * l + 4);
      }
      p.scale[0] = p.scale[1] = 1 + 2 * ((blk.scales[j / 2] >> (4 * (j % 2))) & 0x0f);
      p.d = Tab::half(blk.d);
      break;
    }
    default:
      for (int l = 0; l < 32; ++l) p.q[l] = 0;
      p.d = 0.f;
      break;
  }
}

}  // namespace pyinfer
