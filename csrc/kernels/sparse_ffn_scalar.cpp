// Reference neuron-major axpy for the sparse down projection and the input-sparse projections (their Q8_0 rows);
// every ISA path is tested against it.
// It is also the float-weight (F32/F16) path of every ISA, used by the exactness tests on float models.
#include <cmath>

#include "kernels/fp16.h"
#include "kernels/kernels.h"
#include "kernels/sparse_ffn_walk.h"

namespace pyinfer {

namespace {

// Q4T: per group of 32 neurons, t = sum_j q_j * nibbles_j and t_lo likewise in integers (quantize_group_coefs),
// then y += scale * (d * t + d_lo * t_lo) + offset * sum_j c_j.
void axpy_q4t_scalar(const AxpyRowsArgs& a) {
  const int64_t half = a.scales_stride / 2;
  for_each_q4t_group(a, [&](const Q4TGroup& g) {
    Q4TCoefs qc;
    quantize_group_coefs(a, g, qc);
    const uint16_t* scale = a.scales + int64_t(g.group) * a.scales_stride;
    const uint16_t* offset = scale + half;
    for (int64_t b = a.c0 / kQuantBlock; b < a.c1 / kQuantBlock; ++b) {
      int32_t t[kQuantBlock] = {}, t_lo[kQuantBlock] = {};
      for (int64_t e = g.begin; e < g.end; ++e) {
        const uint8_t* qs = a.row(a.ids[e]) + 16 * b;
        const int32_t q = qc.q[e - g.begin], q_lo = qc.q_lo[e - g.begin];
        for (int j = 0; j < 16; ++j) {
          const int32_t n0 = qs[j] & 0x0f, n1 = qs[j] >> 4;
          t[j] += q * n0;
          t[j + 16] += q * n1;
          t_lo[j] += q_lo * n0;
          t_lo[j + 16] += q_lo * n1;
        }
      }
      for (int j = 0; j < kQuantBlock; ++j) {
        const int64_t c = b * kQuantBlock + j;
        const float sum = std::fma(float(t_lo[j]), qc.d_lo, float(t[j]) * qc.d);
        const float y = std::fma(fp16_to_fp32(scale[c]), sum, a.y[c]);
        a.y[c] = std::fma(fp16_to_fp32(offset[c]), g.coef_sum, y);
      }
    }
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
