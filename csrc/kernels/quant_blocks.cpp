#include "kernels/quant_blocks.h"

#include "kernels/fp16.h"
#include "kernels/kquant_scales.h"

namespace pyinfer {

void kquant_scale_min(const uint8_t* scales, int j, int& scale, int& min) {
  unpack_kquant_scale_min(scales, j, scale, min);
}

namespace {

// Low nibbles are elements 0..15 and high nibbles 16..31 (GGML order); qh bit j is element j's fifth bit.
void nibbles_and_high_bit(const uint8_t* qs, const uint8_t* qh_bytes, int8_t* q) {
  uint32_t qh = 0;
  if (qh_bytes) qh = uint32_t(qh_bytes[0]) | uint32_t(qh_bytes[1]) << 8 | uint32_t(qh_bytes[2]) << 16 | uint32_t(qh_bytes[3]) << 24;
  for (int j = 0; j < 16; ++j) {
    q[j] = int8_t((qs[j] & 0x0f) | (((qh >> j) & 1) << 4));
    q[j + 16] = int8_t((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
  }
}

}  // namespace

void decode_piece(DType type, const uint8_t* row, int64_t b, Piece32& p) {
  p.scale[0] = p.scale[1] = 1;
  p.m = 0.f;
  const int64_t sb = b / 8;  // K-quant super-block and sub-block
  const int j = int(b % 8);
  switch (type) {
    case DType::Q4_0: {
      const auto& blk = reinterpret_cast<const BlockQ4_0*>(row)[b];
      nibbles_and_high_bit(blk.qs, nullptr, p.q);
      p.d = fp16_to_fp32(blk.d);
      p.m = -8.f * p.d;
      break;
    }
    case DType::Q4_1: {
      const auto& blk = reinterpret_cast<const BlockQ4_1*>(row)[b];
      nibbles_and_high_bit(blk.qs, nullptr, p.q);
      p.d = fp16_to_fp32(blk.d);
      p.m = fp16_to_fp32(blk.m);
      break;
    }
    case DType::Q5_0: {
      const auto& blk = reinterpret_cast<const BlockQ5_0*>(row)[b];
      nibbles_and_high_bit(blk.qs, blk.qh, p.q);
      p.d = fp16_to_fp32(blk.d);
      p.m = -16.f * p.d;
      break;
    }
    case DType::Q5_1: {
      const auto& blk = reinterpret_cast<const BlockQ5_1*>(row)[b];
      nibbles_and_high_bit(blk.qs, blk.qh, p.q);
      p.d = fp16_to_fp32(blk.d);
      p.m = fp16_to_fp32(blk.m);
      break;
    }
    case DType::Q8_0: {
      const auto& blk = reinterpret_cast<const BlockQ8_0*>(row)[b];
      for (int l = 0; l < 32; ++l) p.q[l] = blk.qs[l];
      p.d = fp16_to_fp32(blk.d);
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
      kquant_scale_min(k4.scales, j, sc, mn);
      p.scale[0] = p.scale[1] = sc;
      p.d = fp16_to_fp32(k4.d);
      p.m = -fp16_to_fp32(k4.dmin) * float(mn);
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
      p.d = fp16_to_fp32(blk.d);
      break;
    }
    default:
      for (int l = 0; l < 32; ++l) p.q[l] = 0;
      p.d = 0.f;
      break;
  }
}

}  // namespace pyinfer
