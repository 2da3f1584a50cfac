#include "kernels/ops_float.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/fp16.h"
#include "kernels/quant_blocks.h"

namespace pyinfer {

void dequantize_row(DType type, const uint8_t* src, float* dst, int64_t n) {
  switch (type) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(reinterpret_cast<const uint16_t*>(src)[i]);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(reinterpret_cast<const uint16_t*>(src)[i]);
      break;
    default:
      if (!dtype_is_integer_dot(type)) break;
      for (int64_t b = 0; b < n / kQuantBlock; ++b) {
        Piece32 p;
        decode_piece(type, src, b, p);
        if (piece_has_half_mins(type))
          for (int j = 0; j < 32; ++j) dst[b * 32 + j] = p.d * float(p.scale[j / 16] * p.q[j]) + p.m * float(p.mins[j / 16]);
        else
          for (int j = 0; j < 32; ++j) dst[b * 32 + j] = p.d * float(p.scale[j / 16] * p.q[j]) + p.m;
      }
      break;
  }
}

GateCut::GateCut(GateFn fn, float t) {
  if (fn == GateFn::ReLU) {  // one side: g > t (t >= 0); lo = mid = 0 admits nothing below
    hi = t > 0.f ? t : 0.f;
    return;
  }
  const bool gelu = fn == GateFn::GeluTanh;
  auto f = [gelu](float x) {  // the exact function: the profile's cut-offs were measured on it
    return gelu ? 0.5f * x * (1.f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x))) : silu(x);
  };
  auto solve = [t, &f](float a, float b, bool rising) {  // |f| crosses t once in [a, b]
    for (int it = 0; it < 40; ++it) {
      const float m = 0.5f * (a + b);
      ((std::fabs(f(m)) > t) == rising ? b : a) = m;
    }
    return 0.5f * (a + b);
  };
  const float x_min = gelu ? -0.7525f : -1.2785f, f_min = gelu ? 0.1700f : 0.2784f;  // the lobe's bottom
  hi = solve(0.f, 64.f + t, true);
  if (t < f_min) {
    lo = solve(-80.f, x_min, true);
    mid = solve(x_min, 0.f, false);
  }
}

void rms_norm_row(const float* x, const float* weight, float* y, int64_t n, float eps) {
  // llama.cpp's rounding step for step (ggml's rms_norm: float squares summed in double, a float mean, a float
  // scale): the norm feeds the activations' 8-bit rounding, where one ulp of difference can flip a value.
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i] * x[i]);
  const float mean = float(ss / double(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * weight[i];
}

void rope_row(const float* x, float* y, int32_t pos, int heads, int head_dim, float base, RopeMode mode,
              const float* factors, float freq_scale, float attn_factor, int n_rot, const float* yarn) {
  // One angle per pair, shared by every head; any head size (no fixed-size table of angles). The pair
  // frequencies base^(-2i/d) are the same for every row of a run: each thread keeps the last set it
  // computed, so the pow calls happen once per (base, head size) instead of once per pair and row.
  constexpr int kMaxCachedPairs = 512;
  thread_local double freq[kMaxCachedPairs];
  thread_local float freq_base = 0.f;
  thread_local int freq_head_dim = 0;
  const int dims = n_rot > 0 ? n_rot : head_dim;  // the rotated values of each head (the rest pass through)
  const int half = dims / 2;
  const bool cached = half <= kMaxCachedPairs;
  if (cached && (freq_base != base || freq_head_dim != dims)) {
    for (int i = 0; i < half; ++i) freq[i] = std::pow(double(base), -2.0 * i / dims);
    freq_base = base;
    freq_head_dim = dims;
  }
  if (dims < head_dim && x != y)
    for (int h = 0; h < heads; ++h)
      for (int j = dims; j < head_dim; ++j) y[int64_t(h) * head_dim + j] = x[int64_t(h) * head_dim + j];
  const bool yarn_on = yarn && yarn[0] != 0.f;
  const float yarn_mscale = yarn_on ? attn_factor * (1.f + 0.1f * std::log(1.f / freq_scale)) : attn_factor;
  for (int i = 0; i < half; ++i) {
    double theta = double(pos) * (cached ? freq[i] : std::pow(double(base), -2.0 * i / dims));
    if (yarn_on) {  // the scaled angle for slow pairs, the unscaled one for fast pairs, a ramp between
      if (factors) theta /= double(factors[i]);
      const double ramp = 1.0 - std::min(1.0, std::max(0.0, (i - double(yarn[1])) / std::max(0.001, double(yarn[2] - yarn[1]))));
      const double mix = ramp * yarn[0];
      theta = theta * double(freq_scale) * (1.0 - mix) + theta * mix;
    } else {
      if (freq_scale != 1.f) theta *= double(freq_scale);
      if (factors) theta /= double(factors[i]);
    }
    float cs = float(std::cos(theta)), sn = float(std::sin(theta));
    if (yarn_mscale != 1.f) cs *= yarn_mscale, sn *= yarn_mscale;
    const int first = mode == RopeMode::Neox ? i : 2 * i, second = mode == RopeMode::Neox ? i + half : 2 * i + 1;
    for (int h = 0; h < heads; ++h) {
      const int64_t o = int64_t(h) * head_dim;
      const float x0 = x[o + first], x1 = x[o + second];
      y[o + first] = x0 * cs - x1 * sn;
      y[o + second] = x0 * sn + x1 * cs;
    }
  }
}

void add_row(const float* a, const float* b, float* y, int64_t n, float scale) {
  if (scale == 0.f || scale == 1.f) {
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float sb = scale * b[i];  // rounded on its own, as llama.cpp's scale node then its add
    y[i] = a[i] + sb;
  }
}

void scale_row(float* y, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

void softcap_row(const float* x, float* y, int64_t n, float cap) {
  const float inv = 1.f / cap;
  for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i] * inv) * cap;
}

const float* gelu_fp16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(1 << 16);
    for (uint32_t h = 0; h < t.size(); ++h) {
      const double x = fp16_to_fp32(uint16_t(h));
      t[h] = float(0.5 * x * (1.0 + std::tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x))));
    }
    return t;
  }();
  return table.data();
}

void silu_mul_generic(const float* gate, const float* up, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = silu_mul_one(gate[i], up[i]);
}

void gelu_mul_generic(const float* gate, const float* up, float* y, int64_t n) {
  gated_act_row(Activation::GeluTanh, gate, up, y, n);
}

void gated_act_row(Activation a, const float* gate, const float* up, float* y, int64_t n) {
  switch (a) {  // one loop per activation, so each vectorises
    case Activation::SiLU: for (int64_t i = 0; i < n; ++i) y[i] = silu(gate[i]) * up[i]; break;
    case Activation::GeluTanh: {
      const float* table = gelu_fp16_table();
      for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        y[i] = (g <= -10.f ? 0.f : g >= 10.f ? g : table[fp32_to_fp16(g)]) * up[i];
      }
      break;
    }
    default: for (int64_t i = 0; i < n; ++i) y[i] = gated_act(a, gate[i], up[i]); break;
  }
}

}  // namespace pyinfer
