// NEON neuron-major axpy (aarch64): four neurons share each load/store of the output slice.
#if defined(__aarch64__)
#include <arm_neon.h>

#include "kernels/fp16.h"
#include "kernels/kernels.h"
#include "kernels/sparse_ffn_walk.h"

namespace pyinfer {
namespace {

template <int NN>
void axpy_group_q4_1(const AxpyRowsArgs& a, int64_t k) {
  const auto rows = active_rows<BlockQ4_1, NN>(a, k);
  const uint8x16_t mask = vdupq_n_u8(0x0f);
  for (int64_t b = a.c0 / kQuantBlock; b < a.c1 / kQuantBlock; ++b) {
    float* y = a.y + b * kQuantBlock;
    float32x4_t acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = vld1q_f32(y + 4 * j);
    float offset = 0.f;
    for (int i = 0; i < NN; ++i) {
      const BlockQ4_1& blk = rows[i][b];
      const float c = a.coef[k + i];
      const float s = c * fp16_to_fp32(blk.d);
      offset += c * fp16_to_fp32(blk.m);
      const uint8x16_t raw = vld1q_u8(blk.qs);
      const uint8x16_t half[2] = {vandq_u8(raw, mask), vshrq_n_u8(raw, 4)};
      for (int h = 0; h < 2; ++h) {
        const uint16x8_t lo = vmovl_u8(vget_low_u8(half[h])), hi = vmovl_u8(vget_high_u8(half[h]));
        acc[4 * h + 0] = vfmaq_n_f32(acc[4 * h + 0], vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), s);
        acc[4 * h + 1] = vfmaq_n_f32(acc[4 * h + 1], vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo))), s);
        acc[4 * h + 2] = vfmaq_n_f32(acc[4 * h + 2], vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), s);
        acc[4 * h + 3] = vfmaq_n_f32(acc[4 * h + 3], vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi))), s);
      }
    }
    for (int j = 0; j < 8; ++j) vst1q_f32(y + 4 * j, vaddq_f32(acc[j], vdupq_n_f32(offset)));
  }
}

template <int NN>
void axpy_group(const AxpyRowsArgs& a, int64_t k) {
  const auto rows = active_rows<BlockQ8_0, NN>(a, k);
  for (int64_t b = a.c0 / kQuantBlock; b < a.c1 / kQuantBlock; ++b) {
    float* y = a.y + b * kQuantBlock;
    float32x4_t acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = vld1q_f32(y + 4 * j);
    for (int i = 0; i < NN; ++i) {
      const BlockQ8_0& blk = rows[i][b];
      const float s = a.coef[k + i] * fp16_to_fp32(blk.d);
      for (int h = 0; h < 2; ++h) {
        const int8x16_t q = vld1q_s8(blk.qs + 16 * h);
        const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
        acc[4 * h + 0] = vfmaq_n_f32(acc[4 * h + 0], vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), s);
        acc[4 * h + 1] = vfmaq_n_f32(acc[4 * h + 1], vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), s);
        acc[4 * h + 2] = vfmaq_n_f32(acc[4 * h + 2], vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), s);
        acc[4 * h + 3] = vfmaq_n_f32(acc[4 * h + 3], vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), s);
      }
    }
    for (int j = 0; j < 8; ++j) vst1q_f32(y + 4 * j, acc[j]);
  }
}

// Q4T in integers (quantize_group_coefs): each neuron's nibbles times its int8 coefficient digits, widened and
// summed in int16, even and odd neurons apart (at most 16 each: |sum| <= 16 * 15 * 127 < 2^15); the two
// sums are added in int32 and scaled once per group and block.
void axpy_q4t(const AxpyRowsArgs& a) {
  const int64_t half = a.scales_stride / 2;
  const uint8x16_t mask = vdupq_n_u8(0x0f);
  for_each_q4t_group(a, [&](const Q4TGroup& g) {
    Q4TCoefs qc;
    quantize_group_coefs(a, g, qc);
    const uint8_t* rows[kQuantBlock];
    group_rows(a, g, qc.n4, rows);
    const uint16_t* scale = a.scales + int64_t(g.group) * a.scales_stride;
    const uint16_t* offset = scale + half;
    for (int64_t b = a.c0 / kQuantBlock; b < a.c1 / kQuantBlock; ++b) {
      int16x8_t acc[2][2][4];  // [digit][even, odd neurons][columns 0-7, 8-15, 16-23, 24-31]
      for (auto& dg : acc)
        for (auto& p : dg)
          for (auto& v : p) v = vdupq_n_s16(0);
      for (int64_t k = 0; k < qc.n4; ++k) {
        const uint8x16_t raw = vld1q_u8(rows[k] + 16 * b);
        const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(raw, mask)), hi = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
        const int8x8_t n[4] = {vget_low_s8(lo), vget_high_s8(lo), vget_low_s8(hi), vget_high_s8(hi)};
        for (int dg = 0; dg < 2; ++dg) {
          const int8x8_t q = vdup_n_s8(dg ? qc.q_lo[k] : qc.q[k]);
          int16x8_t* p = acc[dg][k & 1];
          for (int j = 0; j < 4; ++j) p[j] = vmlal_s8(p[j], n[j], q);
        }
      }
      const auto sum = [&](int dg, int j, int h) {  // even and odd neurons' int16 sums added in int32
        const int32x4_t s = h ? vaddl_high_s16(acc[dg][0][j], acc[dg][1][j])
                              : vaddl_s16(vget_low_s16(acc[dg][0][j]), vget_low_s16(acc[dg][1][j]));
        return vcvtq_f32_s32(s);
      };
      for (int j = 0; j < 4; ++j) {
        for (int h = 0; h < 2; ++h) {
          const int64_t col = b * kQuantBlock + 8 * j + 4 * h;
          const float32x4_t t = vfmaq_n_f32(vmulq_n_f32(sum(0, j, h), qc.d), sum(1, j, h), qc.d_lo);
          const float32x4_t s = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(scale + col)));
          const float32x4_t o = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(offset + col)));
          const float32x4_t y = vfmaq_f32(vld1q_f32(a.y + col), s, t);
          vst1q_f32(a.y + col, vfmaq_n_f32(y, o, g.coef_sum));
        }
      }
    }
  });
}

}  // namespace

void axpy_rows_neon(const AxpyRowsArgs& a) {
  axpy_dispatch(a, axpy_q4t, [&](int64_t k, auto nn) { axpy_group_q4_1<decltype(nn)::value>(a, k); },
                [&](int64_t k, auto nn) { axpy_group<decltype(nn)::value>(a, k); });
}

}  // namespace pyinfer
#endif
