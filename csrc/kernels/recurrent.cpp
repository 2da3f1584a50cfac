#include "kernels/recurrent.h"

#include <cmath>
#include <cstring>
#include <string>

#include "graph/graph.h"
#include "kernels/ops_float.h"

namespace pyinfer {

int64_t RecurrentRows::row(int64_t t) const {
  if (!rows) return 0;
  const int32_t r = rows[t];
  if (r < 0 || r >= n_rows)
    throw GraphError("state row " + std::to_string(r) + " of token " + std::to_string(t) + " is outside the " +
                     std::to_string(n_rows) + " sequences' states");
  return r;
}

void ssm_conv(const SsmConvArgs& a, const RecurrentRows& rows, int64_t c0, int64_t c1) {
  const int64_t keep = a.taps - 1;
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    float* s = a.state + size_t(rows.row(t)) * a.state_stride;
    const float* x = a.x + size_t(t) * a.x_stride;
    float* y = a.y + size_t(t) * a.y_stride;
    const bool fresh = rows.starts(t);
    for (int64_t c = c0; c < c1; ++c) {
      float* sc = s + c * keep;
      if (fresh) std::memset(sc, 0, size_t(keep) * sizeof(float));
      const float* w = a.weight + size_t(c) * a.w_stride;
      float sum = 0.f;  // ggml's ssm_conv: a float sum, oldest tap first
      for (int64_t i = 0; i < keep; ++i) sum += sc[i] * w[i];
      sum += x[c] * w[keep];
      for (int64_t i = 0; i + 1 < keep; ++i) sc[i] = sc[i + 1];
      sc[keep - 1] = x[c];
      y[c] = a.silu ? silu(sum) : sum;
    }
  }
}

namespace {

// llama.cpp's build_gdn_l2_norm: rms_norm with eps / n (its sum of squares in double), then times 1 / sqrt(n).
void l2_norm(const float* x, float* y, int n, float eps) {
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += double(x[i] * x[i]);
  const float mean = float(sum / n);
  const float scale = 1.0f / std::sqrt(mean + eps / float(n));
  const float post = 1.0f / std::sqrt(float(n));
  for (int i = 0; i < n; ++i) y[i] = x[i] * scale * post;
}

float dot(const float* a, const float* b, int n) {
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void delta_net(const DeltaNetArgs& a, const RecurrentRows& rows, int h0, int h1, float* scratch) {
  const int S = a.head_dim;
  const size_t SS = size_t(S) * size_t(S);
  float* q = scratch;
  float* k = scratch + S;
  float* delta = scratch + 2 * S;
  const float out_scale = 1.0f / std::sqrt(float(S));
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    float* state = a.state + size_t(rows.row(t)) * a.state_stride;
    const float* qkv = a.qkv + size_t(t) * a.qkv_stride;
    const bool fresh = rows.starts(t);
    for (int h = h0; h < h1; ++h) {
      float* M = state + size_t(h) * SS;  // M[j * S + i] = S[i][j]: row j of M is column j of the state
      if (fresh) std::memset(M, 0, SS * sizeof(float));
      const int kh = h % a.k_heads;  // ggml repeats the k heads across the v heads
      l2_norm(qkv + size_t(kh) * S, q, S, a.eps);
      l2_norm(qkv + size_t(a.k_heads + kh) * S, k, S, a.eps);
      const float* v = qkv + size_t(2 * a.k_heads + h) * S;
      const float beta = 1.0f / (1.0f + std::exp(-a.beta[size_t(t) * a.beta_stride + h]));
      const float z = a.alpha[size_t(t) * a.alpha_stride + h] + a.dt_bias[h];
      const float g = (z > 20.0f ? z : std::log(1.0f + std::exp(z))) * a.a[h];  // softplus as ggml's
      const float decay = std::exp(g);
      for (size_t i = 0; i < SS; ++i) M[i] *= decay;
      for (int j = 0; j < S; ++j) delta[j] = (v[j] - dot(M + size_t(j) * S, k, S)) * beta;
      for (int j = 0; j < S; ++j) {
        float* row = M + size_t(j) * S;
        const float dj = delta[j];
        for (int i = 0; i < S; ++i) row[i] += k[i] * dj;
      }
      float* out = a.out + size_t(t) * a.out_stride + size_t(h) * S;
      for (int j = 0; j < S; ++j) out[j] = dot(M + size_t(j) * S, q, S) * out_scale;
    }
  }
}

}  // namespace pyinfer
