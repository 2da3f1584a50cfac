// Reference neuron-major axpy for the sparse down projection; every ISA path is tested against it.
// It is also the float-weight (F32/F16) path of every ISA, used by the exactness tests on float models.
#include "kernels/fp16.h"
#include "kernels/kernels.h"
#include "kernels/sparse_ffn_walk.h"

namespace pyinfer {

namespace {

// Q4T: per group of 32 neurons, t = sum_j c_j * q_j (the nibbles), then y += scale * t + offset * sum_j c_j.
void axpy_q4t_scalar(const AxpyRowsArgs& a) {
  const int64_t half = a.scales_stride / 2;
  for_each_q4t_group(a, [&](const Q4TGroup& g) {
    for (int64_t c = a.c0; c < a.c1; ++c) a.tmp[c - a.c0] = 0.f;
    for (int64_t e = g.begin; e < g.end; ++e) {
      const uint8_t* row = a.row(a.ids[e]);
      const float c = a.coef[e];
      for (int64_t b = a.c0 / kQuantBlock; b < a.c1 / kQuantBlock; ++b) {
        const uint8_t* qs = row + 16 * b;
        float* t = a.tmp + b * kQuantBlock - a.c0;
        for (int j = 0; j < 16; ++j) {
          t[j] += c * float(qs[j] & 0x0f);
          t[j + 16] += c * float(qs[j] >> 4);
        }
      }
    }
    const uint16_t* scale = a.scales + int64_t(g.group) * a.scales_stride;
    const uint16_t* offset = scale + half;
    for (int64_t c = a.c0; c < a.c1; ++c)
      a.y[c] += fp16_to_fp32(scale[c]) * a.tmp[c - a.c0] + fp16_to_fp32(offset[c]) * g.coef_sum;
  });
}

}  // namespace

void axpy_rows_scalar(const AxpyRowsArgs& a) {
  if (a.wtype == DType::Q4T) return axpy_q4t_scalar(a);
  for (int64_t k = 0; k < a.n; ++k) {
    const uint8_t* row = a.row(a.ids[k]);
    const float c = a.coef[k];
    switch (a.wtype) {
      case DType::Q8_0: {
        const auto* blocks = reinterpret_cast<const BlockQ8_0*>(row);
        for (int64_t b = a.c0 / kQuantBlock; b < a.c1 / kQuantBlock; ++b) {
          const float s = c * fp16_to_fp32(blocks[b].d);
          float* y = a.y + b * kQuantBlock;
          for (int j = 0; j < kQuantBlock; ++j) y[j] += s * float(blocks[b].qs[j]);
        }
        break;
      }
      case DType::Q4_1: {  // x = d * q + m
        const auto* blocks = reinterpret_cast<const BlockQ4_1*>(row);
        for (int64_t b = a.c0 / kQuantBlock; b < a.c1 / kQuantBlock; ++b) {
          const float s = c * fp16_to_fp32(blocks[b].d), o = c * fp16_to_fp32(blocks[b].m);
          float* y = a.y + b * kQuantBlock;
          for (int j = 0; j < 16; ++j) {
            y[j] += s * float(blocks[b].qs[j] & 0x0f) + o;
            y[j + 16] += s * float(blocks[b].qs[j] >> 4) + o;
          }
        }
        break;
      }
      case DType::F32: {
        const auto* w = reinterpret_cast<const float*>(row);
        for (int64_t i = a.c0; i < a.c1; ++i) a.y[i] += c * w[i];
        break;
      }
      case DType::F16: {
        const auto* w = reinterpret_cast<const uint16_t*>(row);
        for (int64_t i = a.c0; i < a.c1; ++i) a.y[i] += c * fp16_to_fp32(w[i]);
        break;
      }
      default: break;
    }
  }
}

}  // namespace pyinfer
