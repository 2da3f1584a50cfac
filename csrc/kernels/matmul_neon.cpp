// NEON kernels (aarch64, where NEON is baseline). Integer dot via widening multiplies, so no
// dotprod extension is required.
#if defined(__aarch64__)
#include <arm_neon.h>

#include <cmath>

#include "kernels/fp16.h"
#include "kernels/attention.h"
#include "kernels/ops_float.h"
#include "kernels/kernels.h"

namespace pyinfer {
namespace {

inline int32_t dot_s8x16(int8x16_t a, int8x16_t b) {
  int32x4_t s = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
  s = vpadalq_s16(s, vmull_s8(vget_high_s8(a), vget_high_s8(b)));
  return vaddvq_s32(s);
}

// Integer dot of one 32-element weight block (as two int8x16 halves) with an activation block.
inline int32_t block_dot(int8x16_t w_lo, int8x16_t w_hi, const BlockQ8A& x) {
  return dot_s8x16(w_lo, vld1q_s8(x.qs)) + dot_s8x16(w_hi, vld1q_s8(x.qs + 16));
}

float row_dot(DType wt, const uint8_t* w, const BlockQ8A* x, int64_t nb) {
  float sum = 0.f;
  const uint8x16_t mask = vdupq_n_u8(0x0f);
  for (int64_t b = 0; b < nb; ++b) {
    if (wt == DType::Q8_0) {
      const auto& blk = reinterpret_cast<const BlockQ8_0*>(w)[b];
      const int32_t i = block_dot(vld1q_s8(blk.qs), vld1q_s8(blk.qs + 16), x[b]);
      sum += fp16_to_fp32(blk.d) * x[b].d * float(i);
    } else if (wt == DType::Q4_1) {
      const auto& blk = reinterpret_cast<const BlockQ4_1*>(w)[b];
      const uint8x16_t q = vld1q_u8(blk.qs);
      const int32_t i = block_dot(vreinterpretq_s8_u8(vandq_u8(q, mask)), vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), x[b]);
      sum += fp16_to_fp32(blk.d) * x[b].d * float(i) + fp16_to_fp32(blk.m) * x[b].s;
    } else {  // Q4_0
      const auto& blk = reinterpret_cast<const BlockQ4_0*>(w)[b];
      const uint8x16_t q = vld1q_u8(blk.qs);
      const int32_t i = block_dot(vreinterpretq_s8_u8(vandq_u8(q, mask)), vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), x[b]);
      sum += fp16_to_fp32(blk.d) * (x[b].d * float(i) - 8.f * x[b].s);
    }
  }
  return sum;
}

void matmul_neon(const MatMulArgs& a) {
  if (!dtype_is_quantized(a.wtype)) return matmul_float_weights(a);
  // The 5-bit and K-quant types have no NEON kernel yet: the portable one computes them.
  if (a.wtype != DType::Q4_0 && a.wtype != DType::Q4_1 && a.wtype != DType::Q8_0) return matmul_scalar(a);
  const int64_t nb = a.k / kQuantBlock;
  for (int64_t t = 0; t < a.n_tok; ++t) {
    const auto* x = reinterpret_cast<const BlockQ8A*>(static_cast<const uint8_t*>(a.x) + t * a.x_row_bytes);
    for (int64_t i = a.r0; i < a.r1; ++i) {
      const int64_t r = a.row_ids ? a.row_ids[i] : i;
      a.dst[t * a.ldd + r] = row_dot(a.wtype, a.row(r), x, nb);
    }
  }
}

void quantize_q8a_neon(const float* x, BlockQ8A* y, int64_t n) {
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float* xb = x + b * kQuantBlock;
    float32x4_t v[8];
    float32x4_t amax = vdupq_n_f32(0.f);
    for (int j = 0; j < 8; ++j) {
      v[j] = vld1q_f32(xb + 4 * j);
      amax = vmaxq_f32(amax, vabsq_f32(v[j]));
    }
    const float mx = vmaxvq_f32(amax);
    const float d = mx / 127.f, id = mx > 0.f ? 127.f / mx : 0.f;
    int32_t sum = 0;
    for (int j = 0; j < 8; ++j) {
      const int32x4_t q = vcvtnq_s32_f32(vmulq_n_f32(v[j], id));  // round half to even
      sum += vaddvq_s32(q);
      const int16x4_t q16 = vmovn_s32(q);
      const int8x8_t q8 = vmovn_s16(vcombine_s16(q16, q16));
      y[b].qs[4 * j + 0] = vget_lane_s8(q8, 0);
      y[b].qs[4 * j + 1] = vget_lane_s8(q8, 1);
      y[b].qs[4 * j + 2] = vget_lane_s8(q8, 2);
      y[b].qs[4 * j + 3] = vget_lane_s8(q8, 3);
    }
    y[b].d = d;
    y[b].s = d * float(sum);
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

}  // namespace

const KernelTable* kernels_neon() {
  static const KernelTable table{"neon", matmul_neon, quantize_q8a_neon, dot_f16_f32_neon,
                                 axpy_f16_f32_neon, f32_to_f16_neon, axpy_rows_neon,
                                 attn_tile_generic, kv_to_f32_generic, gelu_mul_generic};
  return &table;
}

}  // namespace pyinfer
#else
#include "kernels/kernels.h"
namespace pyinfer {
const KernelTable* kernels_neon() { return nullptr; }
}  // namespace pyinfer
#endif
