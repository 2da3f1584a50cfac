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

// Q4T: per 32-neuron group, t = sum_j c_j * nibbles_j over this thread's columns, then y += scale * t +
// offset * sum_j c_j with the group's shared scales.
void q4t_accumulate(const AxpyRowsArgs& a, int64_t i, uint8x16_t mask) {
  const uint8_t* row = a.row(a.ids[i]);
  const float c = a.coef[i];
  for (int64_t b = a.c0 / kQuantBlock; b < a.c1 / kQuantBlock; ++b) {
    float* t = a.tmp + b * kQuantBlock - a.c0;
    const uint8x16_t raw = vld1q_u8(row + 16 * b);
    const uint8x16_t halves[2] = {vandq_u8(raw, mask), vshrq_n_u8(raw, 4)};
    for (int h = 0; h < 2; ++h) {
      const uint16x8_t lo = vmovl_u8(vget_low_u8(halves[h])), hi = vmovl_u8(vget_high_u8(halves[h]));
      float* th = t + 16 * h;
      vst1q_f32(th + 0, vfmaq_n_f32(vld1q_f32(th + 0), vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), c));
      vst1q_f32(th + 4, vfmaq_n_f32(vld1q_f32(th + 4), vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo))), c));
      vst1q_f32(th + 8, vfmaq_n_f32(vld1q_f32(th + 8), vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), c));
      vst1q_f32(th + 12, vfmaq_n_f32(vld1q_f32(th + 12), vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi))), c));
    }
  }
}

// Q4T: per 32-neuron group, t = sum_j c_j * nibbles_j over this thread's columns, then y += scale * t +
// offset * sum_j c_j with the group's shared scales.
void axpy_q4t(const AxpyRowsArgs& a) {
  const int64_t half = a.scales_stride / 2, width = a.c1 - a.c0;
  const uint8x16_t mask = vdupq_n_u8(0x0f);
  for_each_q4t_group(a, [&](const Q4TGroup& g) {
    for (int64_t c = 0; c < width; c += 4) vst1q_f32(a.tmp + c, vdupq_n_f32(0.f));
    for (int64_t i = g.begin; i < g.end; ++i) q4t_accumulate(a, i, mask);
    const uint16_t* scale = a.scales + int64_t(g.group) * a.scales_stride;
    const uint16_t* offset = scale + half;
    for (int64_t c = a.c0; c < a.c1; c += 4) {
      const float32x4_t s = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(scale + c)));
      const float32x4_t o = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(offset + c)));
      const float32x4_t y = vfmaq_f32(vld1q_f32(a.y + c), s, vld1q_f32(a.tmp + c - a.c0));
      vst1q_f32(a.y + c, vfmaq_n_f32(y, o, g.coef_sum));
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
