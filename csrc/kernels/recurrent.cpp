#include "kernels/recurrent.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "graph/graph.h"
#include "kernels/delta_rule_chunk.h"
#include "kernels/ops_float.h"
#include "kernels/vec8.h"

namespace pyinfer {

int64_t RecurrentRows::row(int64_t t) const {
  if (!rows) return 0;
  const int32_t r = rows[t];
  if (r < 0 || r >= n_rows)
    throw GraphError("state row " + std::to_string(r) + " of token " + std::to_string(t) + " is outside the " +
                     std::to_string(n_rows) + " sequences' states");
  return r;
}

int64_t delta_net_scratch_floats(int head_dim) {
  return std::max<int64_t>(2 * int64_t(head_dim), delta_chunk_scratch_floats(head_dim));
}

int64_t RecurrentRows::run_end(int64_t t, int64_t n_tokens) const {
  const int64_t r = row(t);
  int64_t e = t + 1;
  while (e < n_tokens && positions[e] == positions[e - 1] + 1 && row(e) == r) ++e;
  return e;
}

namespace {

// One token through channels [c0, c1), reading and rolling the state (ggml's ssm_conv: a float sum, oldest tap
// first), then SiLU (the polynomial of silu_row, so a prompt and its decode agree).
void conv_token(const SsmConvArgs& a, const RecurrentRows& rows, int64_t t, int64_t c0, int64_t c1) {
  const int64_t keep = a.taps - 1;
  float* s = a.state + size_t(rows.row(t)) * a.state_stride;
  const float* x = a.x + size_t(t) * a.x_stride;
  float* y = a.y + size_t(t) * a.y_stride;
  const bool fresh = rows.starts(t);
  for (int64_t c = c0; c < c1; ++c) {
    float* sc = s + c * keep;
    if (fresh) std::memset(sc, 0, size_t(keep) * sizeof(float));
    const float* w = a.weight + size_t(c) * a.w_stride;
    float sum = 0.f;
    for (int64_t i = 0; i < keep; ++i) sum += sc[i] * w[i];
    sum += x[c] * w[keep];
    for (int64_t i = 0; i + 1 < keep; ++i) sc[i] = sc[i + 1];
    sc[keep - 1] = x[c];
    y[c] = a.silu ? silu_mul_one(sum, 1.f) : sum;
  }
}

// Token t of a run whose taps all lie in the run (t - keep at or after its start): the same sums over the input
// rows themselves, no state, channels in vector lanes (Qwen3.5's 4 taps unrolled).
template <int K>
PYI_VEC8_CLONES void conv_row_taps(const SsmConvArgs& a, int64_t t, int64_t c0, int64_t c1) {
  const float* x[K];
  for (int i = 0; i < K; ++i) x[i] = a.x + size_t(t - (K - 1) + i) * a.x_stride;
  float* y = a.y + size_t(t) * a.y_stride;
  for (int64_t c = c0; c < c1; ++c) {
    const float* w = a.weight + size_t(c) * a.w_stride;
    float sum = 0.f;
    for (int i = 0; i < K; ++i) sum += x[i][c] * w[i];
    y[c] = sum;
  }
}

// SiLU in place, as the dense FFN's polynomial (silu_mul_one): in vector lanes, where libm's expf is a call per value.
PYI_VEC8_CLONES void silu_row(float* y, int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; ++c) y[c] = silu_mul_one(y[c], 1.f);
}

void conv_row(const SsmConvArgs& a, int64_t t, int64_t c0, int64_t c1) {
  const int64_t keep = a.taps - 1;
  float* y = a.y + size_t(t) * a.y_stride;
  if (a.taps == 4) {
    conv_row_taps<4>(a, t, c0, c1);
  } else {
    for (int64_t c = c0; c < c1; ++c) {
      const float* w = a.weight + size_t(c) * a.w_stride;
      float sum = 0.f;
      for (int64_t i = 0; i <= keep; ++i) sum += a.x[size_t(t - keep + i) * a.x_stride + c] * w[i];
      y[c] = sum;
    }
  }
  if (a.silu) silu_row(y, c0, c1);
}

}  // namespace

void ssm_conv(const SsmConvArgs& a, const RecurrentRows& rows, int64_t c0, int64_t c1) {
  const int64_t keep = a.taps - 1;
  for (int64_t t0 = 0; t0 < a.n_tokens;) {
    const int64_t t1 = rows.run_end(t0, a.n_tokens);
    const int64_t head = std::min(t1, t0 + keep);  // the run's first tokens read the state
    for (int64_t t = t0; t < head; ++t) conv_token(a, rows, t, c0, c1);
    if (t1 > head) {  // a prompt: the rest reads its own inputs; the state is then its last `keep` inputs
      for (int64_t t = head; t < t1; ++t) conv_row(a, t, c0, c1);
      float* s = a.state + size_t(rows.row(t0)) * a.state_stride;
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t i = 0; i < keep; ++i) s[c * keep + i] = a.x[size_t(t1 - keep + i) * a.x_stride + c];
    }
    t0 = t1;
  }
}

namespace {

// llama.cpp's build_gdn_l2_norm: rms_norm with eps / n (its squares rounded to float, summed in double), then times
// 1 / sqrt(n). Eight double sums in turn (one chain of double adds held a token's head for ~500 cycles); in double,
// the order changes the float result only at a rounding tie.
PYI_VEC8_CLONES
void l2_norm(const float* x, float* y, int n, float eps) {
  typedef double v4d __attribute__((vector_size(32), aligned(8)));
  typedef float v4f __attribute__((vector_size(16), aligned(4)));
  v4d s0 = {0, 0, 0, 0}, s1 = {0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const v4f a = *reinterpret_cast<const v4f*>(x + i), b = *reinterpret_cast<const v4f*>(x + i + 4);
    s0 += __builtin_convertvector(a * a, v4d);
    s1 += __builtin_convertvector(b * b, v4d);
  }
  const v4d s = s0 + s1;
  double sum = (s[0] + s[1]) + (s[2] + s[3]);
  for (; i < n; ++i) sum += double(x[i] * x[i]);
  const float mean = float(sum / n);
  const float scale = 1.0f / std::sqrt(mean + eps / float(n));
  const float post = 1.0f / std::sqrt(float(n));
  for (i = 0; i < n; ++i) y[i] = x[i] * scale * post;
}

// One head's token: each column j of the state (row j of M) is decayed, read against k for the delta, updated and
// read against q in one pass while it sits in L1. Column j's steps depend on column j only, so this is the same
// arithmetic as ggml's pass-per-step loop; its dot products keep ggml's AVX2 partial sums (4 x 8 lanes, reduced
// pairwise), four independent chains in registers.
PYI_VEC8_CLONES
void delta_rule_token(float* M, int S, const float* q, const float* k, const float* v, float beta, float decay,
                      float out_scale, float* out) {
  using namespace vec8;
  const int S32 = S - S % 32;
  const v8 dv = splat(decay);
  for (int j = 0; j < S; ++j) {
    float* row = M + size_t(j) * S;
    v8 a0 = splat(0), a1 = splat(0), a2 = splat(0), a3 = splat(0);
    for (int i = 0; i < S32; i += 32) {
      const v8 r0 = load(row + i) * dv, r1 = load(row + i + 8) * dv, r2 = load(row + i + 16) * dv,
               r3 = load(row + i + 24) * dv;
      store(row + i, r0), store(row + i + 8, r1), store(row + i + 16, r2), store(row + i + 24, r3);
      a0 += r0 * load(k + i), a1 += r1 * load(k + i + 8), a2 += r2 * load(k + i + 16), a3 += r3 * load(k + i + 24);
    }
    float sk = hsum((a0 + a2) + (a1 + a3));
    for (int i = S32; i < S; ++i) {
      row[i] *= decay;
      sk += row[i] * k[i];
    }
    const float dj = (v[j] - sk) * beta;
    const v8 dd = splat(dj);
    a0 = a1 = a2 = a3 = splat(0);
    for (int i = 0; i < S32; i += 32) {
      const v8 r0 = load(row + i) + load(k + i) * dd, r1 = load(row + i + 8) + load(k + i + 8) * dd,
               r2 = load(row + i + 16) + load(k + i + 16) * dd, r3 = load(row + i + 24) + load(k + i + 24) * dd;
      store(row + i, r0), store(row + i + 8, r1), store(row + i + 16, r2), store(row + i + 24, r3);
      a0 += r0 * load(q + i), a1 += r1 * load(q + i + 8), a2 += r2 * load(q + i + 16), a3 += r3 * load(q + i + 24);
    }
    float sq = hsum((a0 + a2) + (a1 + a3));
    for (int i = S32; i < S; ++i) {
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
  const float out_scale = 1.0f / std::sqrt(float(S));
  auto head_inputs = [&](int64_t t, int h, float* q, float* k, float& beta, float& log_decay) {
    const float* qkv = a.qkv + size_t(t) * a.qkv_stride;
    const int kh = a.grouped ? h / (a.v_heads / a.k_heads) : h % a.k_heads;
    l2_norm(qkv + size_t(kh) * S, q, S, a.eps);
    l2_norm(qkv + size_t(a.k_heads + kh) * S, k, S, a.eps);
    beta = 1.0f / (1.0f + std::exp(-a.beta[size_t(t) * a.beta_stride + h]));
    const float z = a.alpha[size_t(t) * a.alpha_stride + h] + a.dt_bias[h];
    log_decay = (z > 20.0f ? z : std::log(1.0f + std::exp(z))) * a.a[h];  // softplus as ggml's
  };
  auto v_row = [&](int64_t t, int h) { return a.qkv + size_t(t) * a.qkv_stride + size_t(2 * a.k_heads + h) * S; };
  auto out_row = [&](int64_t t, int h) { return a.out + size_t(t) * a.out_stride + size_t(h) * S; };

  for (int64_t t0 = 0; t0 < a.n_tokens;) {
    const int64_t t1 = rows.run_end(t0, a.n_tokens);
    float* state = a.state + size_t(rows.row(t0)) * a.state_stride;
    if (t1 - t0 >= kDeltaChunkMinRun && delta_chunk_fits(S)) {  // a prompt: the run in chunks, head by head
      for (int h = h0; h < h1; ++h) {
        float* M = state + size_t(h) * SS;
        if (rows.starts(t0)) std::memset(M, 0, SS * sizeof(float));
        for (int64_t c0 = t0; c0 < t1; c0 += kDeltaChunk) {
          const int n = int(std::min<int64_t>(kDeltaChunk, t1 - c0));
          const float* v[kDeltaChunk];
          float* out[kDeltaChunk];
          float beta[kDeltaChunk], log_decay[kDeltaChunk];
          for (int s = 0; s < n; ++s) {
            head_inputs(c0 + s, h, delta_chunk_q(scratch, S) + size_t(s) * S,
                        delta_chunk_k(scratch, S) + size_t(s) * S, beta[s], log_decay[s]);
            v[s] = v_row(c0 + s, h);
            out[s] = out_row(c0 + s, h);
          }
          delta_rule_chunk(M, S, DeltaChunk{n, v, beta, log_decay, out}, out_scale, scratch);
        }
      }
    } else {
      float* q = scratch;
      float* k = scratch + S;
      for (int64_t t = t0; t < t1; ++t)
        for (int h = h0; h < h1; ++h) {
          float* M = state + size_t(h) * SS;  // M[j * S + i] = S[i][j]: row j of M is column j of the state
          if (rows.starts(t)) std::memset(M, 0, SS * sizeof(float));
          float beta, log_decay;
          head_inputs(t, h, q, k, beta, log_decay);
          delta_rule_token(M, S, q, k, v_row(t, h), beta, std::exp(log_decay), out_scale, out_row(t, h));
        }
    }
    t0 = t1;
  }
}

}  // namespace pyinfer
