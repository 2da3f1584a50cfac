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

// (Not under the sanitizers' builds: an ifunc resolver runs before their runtime is up.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define PYI_RECURRENT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PYI_RECURRENT_CLONES
#endif

// One head's token: each column j of the state (row j of M) is decayed, read against k for the delta, updated and
// read against q in one pass while it sits in L1. Column j's steps depend on column j only, so this is the same
// arithmetic as ggml's pass-per-step loop. Partial sums in 8 lanes: vectorised without reassociation flags.
PYI_RECURRENT_CLONES
void delta_rule_token(float* M, int S, const float* q, const float* k, const float* v, float beta, float decay,
                      float out_scale, float* out) {
  for (int j = 0; j < S; ++j) {
    float* row = M + size_t(j) * S;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= S; i += 8)
      for (int l = 0; l < 8; ++l) {
        row[i + l] *= decay;
        acc[l] += row[i + l] * k[i + l];
      }
    float sk = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < S; ++i) {
      row[i] *= decay;
      sk += row[i] * k[i];
    }
    const float dj = (v[j] - sk) * beta;
    float acq[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    i = 0;
    for (; i + 8 <= S; i += 8)
      for (int l = 0; l < 8; ++l) {
        row[i + l] += k[i + l] * dj;
        acq[l] += row[i + l] * q[i + l];
      }
    float sq = ((acq[0] + acq[4]) + (acq[1] + acq[5])) + ((acq[2] + acq[6]) + (acq[3] + acq[7]));
    for (; i < S; ++i) {
      row[i] += k[i] * dj;
      sq += row[i] * q[i];
    }
    out[j] = sq * out_scale;
  }
}

}  // namespace

void delta_net(const DeltaNetArgs& a, const RecurrentRows& rows, int h0, int h1, float* scratch) {
  const int S = a.head_dim;
  const size_t SS = size_t(S) * size_t(S);
  float* q = scratch;
  float* k = scratch + S;
  const float out_scale = 1.0f / std::sqrt(float(S));
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    float* state = a.state + size_t(rows.row(t)) * a.state_stride;
    const float* qkv = a.qkv + size_t(t) * a.qkv_stride;
    const bool fresh = rows.starts(t);
    for (int h = h0; h < h1; ++h) {
      float* M = state + size_t(h) * SS;  // M[j * S + i] = S[i][j]: row j of M is column j of the state
      if (fresh) std::memset(M, 0, SS * sizeof(float));
      const int kh = a.grouped ? h / (a.v_heads / a.k_heads) : h % a.k_heads;
      l2_norm(qkv + size_t(kh) * S, q, S, a.eps);
      l2_norm(qkv + size_t(a.k_heads + kh) * S, k, S, a.eps);
      const float* v = qkv + size_t(2 * a.k_heads + h) * S;
      const float beta = 1.0f / (1.0f + std::exp(-a.beta[size_t(t) * a.beta_stride + h]));
      const float z = a.alpha[size_t(t) * a.alpha_stride + h] + a.dt_bias[h];
      const float g = (z > 20.0f ? z : std::log(1.0f + std::exp(z))) * a.a[h];  // softplus as ggml's
      delta_rule_token(M, S, q, k, v, beta, std::exp(g), out_scale,
                       a.out + size_t(t) * a.out_stride + size_t(h) * S);
    }
  }
}

}  // namespace pyinfer
