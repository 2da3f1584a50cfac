#include "kernels/ops_float.h"

#include <cmath>
#include <cstring>

#include "kernels/fp16.h"

namespace pyinfer {

void dequantize_row(DType type, const uint8_t* src, float* dst, int64_t n) {
  const int64_t nb = n / kQuantBlock;
  switch (type) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(reinterpret_cast<const uint16_t*>(src)[i]);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(reinterpret_cast<const uint16_t*>(src)[i]);
      break;
    case DType::Q8_0:
      for (int64_t b = 0; b < nb; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ8_0*>(src)[b];
        const float d = fp16_to_fp32(blk.d);
        for (int j = 0; j < 32; ++j) dst[b * 32 + j] = d * blk.qs[j];
      }
      break;
    case DType::Q4_0:
      for (int64_t b = 0; b < nb; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ4_0*>(src)[b];
        const float d = fp16_to_fp32(blk.d);
        for (int j = 0; j < 16; ++j) {
          dst[b * 32 + j] = d * ((blk.qs[j] & 0x0f) - 8);
          dst[b * 32 + j + 16] = d * ((blk.qs[j] >> 4) - 8);
        }
      }
      break;
    case DType::Q4_1:
      for (int64_t b = 0; b < nb; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ4_1*>(src)[b];
        const float d = fp16_to_fp32(blk.d), m = fp16_to_fp32(blk.m);
        for (int j = 0; j < 16; ++j) {
          dst[b * 32 + j] = d * (blk.qs[j] & 0x0f) + m;
          dst[b * 32 + j + 16] = d * (blk.qs[j] >> 4) + m;
        }
      }
      break;
    default: break;
  }
}

void rms_norm_row(const float* x, const float* weight, float* y, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float scale = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * weight[i];
}

void rope_row(const float* x, float* y, int32_t pos, int heads, int head_dim, float base) {
  // One angle per pair, shared by every head; any head size (no fixed-size table of angles).
  for (int i = 0; i < head_dim / 2; ++i) {
    const double theta = double(pos) * std::pow(double(base), -2.0 * i / head_dim);
    const float cs = float(std::cos(theta)), sn = float(std::sin(theta));
    for (int h = 0; h < heads; ++h) {
      const int64_t o = int64_t(h) * head_dim + 2 * i;
      const float x0 = x[o], x1 = x[o + 1];
      y[o] = x0 * cs - x1 * sn;
      y[o + 1] = x0 * sn + x1 * cs;
    }
  }
}

void add_row(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void silu_mul_row(const float* gate, const float* up, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = silu(gate[i]) * up[i];
}

void relu_mul_row(const float* gate, const float* up, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = (gate[i] > 0.f ? gate[i] : 0.f) * up[i];
}

}  // namespace pyinfer
