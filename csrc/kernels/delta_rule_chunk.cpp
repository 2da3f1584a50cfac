#include "kernels/delta_rule_chunk.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/ops_float.h"
#include "kernels/vec8.h"

namespace pyinfer {

namespace {

using namespace vec8;

// e^x for x <= 0 lanes (decay ratios): 2^n p(r) with ops_float.h's constants (silu_mul_one's exp), clamped below
// as there (e^x < 1e-37: a decay that has run out).
inline __attribute__((always_inline)) v8 exp_nonpositive(v8 x) {
  x = x < splat(kSiluClampLo) ? splat(kSiluClampLo) : x;
  x = x > splat(0.f) ? splat(0.f) : x;  // (lanes that are masked out afterwards may hold any value)
  const v8 magic = splat(12582912.f);  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const v8 n = (x * splat(kLog2e) + magic) - magic;
  v8 r = x - n * splat(kLn2Hi);
  r = r - n * splat(kLn2Lo);
  v8 p = splat(kExpC[6]);
  for (int k = 5; k >= 0; --k) p = p * r + splat(kExpC[k]);
  const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
  v8 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// Out[r][c] = (scale_rows ? scale_rows[r * scale_stride] * Out[r][c] : 0) + sum_{x < kd(r)} A[r][x] * B[x][c],
// rows in blocks of 8 or 4 and columns in blocks of 16 (16 or 8 sums in registers; A's entries broadcast, B's rows
// loaded). kd(r) is `kd`, or with `lower_kd` the end of r's block of 4 (B's rows past it are only ever multiplied
// by zeros). rows % 4 == 0, cols % 16 == 0. Column blocks past the row block are skipped when `lower_cols` (their
// outputs are never read).
template <int RB>
inline __attribute__((always_inline)) void gemm_block(const float* A, int lda, const float* B, int ldb, float* Out,
                                                      int ldo, int r, int c, int kend, const float* scale_rows,
                                                      int scale_stride) {
  v8 acc[RB][2];
  for (int a = 0; a < RB; ++a) {
    float* o = Out + size_t(r + a) * ldo + c;
    if (scale_rows) {
      const v8 s = splat(scale_rows[size_t(r + a) * scale_stride]);
      acc[a][0] = load(o) * s;
      acc[a][1] = load(o + 8) * s;
    } else {
      acc[a][0] = acc[a][1] = splat(0);
    }
  }
  for (int x = 0; x < kend; ++x) {
    const v8 b0 = load(B + size_t(x) * ldb + c), b1 = load(B + size_t(x) * ldb + c + 8);
    for (int a = 0; a < RB; ++a) {
      const v8 av = splat(A[size_t(r + a) * lda + x]);
      acc[a][0] += av * b0;
      acc[a][1] += av * b1;
    }
  }
  for (int a = 0; a < RB; ++a) {
    float* o = Out + size_t(r + a) * ldo + c;
    store(o, acc[a][0]);
    store(o + 8, acc[a][1]);
  }
}

PYI_VEC8_CLONES
void gemm(const float* A, int lda, const float* B, int ldb, float* Out, int ldo, int rows, int cols, int kd,
          const float* scale_rows, int scale_stride, bool lower_kd, bool lower_cols) {
  for (int r = 0; r < rows; r += 4) {
    const int kend = lower_kd ? r + 4 : kd;
    const int cend = lower_cols ? (r + 4 + 15) / 16 * 16 : cols;
    if (!lower_kd && !lower_cols && r + 8 <= rows) {  // 8 rows at once where every row reads the same span
      for (int c = 0; c < cend; c += 16) gemm_block<8>(A, lda, B, ldb, Out, ldo, r, c, kend, scale_rows, scale_stride);
      r += 4;
      continue;
    }
    for (int c = 0; c < cend; c += 16) gemm_block<4>(A, lda, B, ldb, Out, ldo, r, c, kend, scale_rows, scale_stride);
  }
}

// Dst[c][r] = Src[r][c] for an R x Cn block (row strides ls, ld; R, Cn multiples of 8): 8 x 8 tiles through
// registers (unpack, pair shuffles, half swaps).
PYI_VEC8_CLONES
void transpose(const float* Src, int ls, float* Dst, int ld, int R, int Cn) {
  for (int r0 = 0; r0 < R; r0 += 8)
    for (int c0 = 0; c0 < Cn; c0 += 8) {
      v8 r[8], t[8], u[8];
      for (int k = 0; k < 8; ++k) r[k] = load(Src + size_t(r0 + k) * ls + c0);
      for (int k = 0; k < 8; k += 2) {
        t[k] = PYI_V8_SHUFFLE2(r[k], r[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[k + 1] = PYI_V8_SHUFFLE2(r[k], r[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
      }
      for (int k = 0; k < 8; k += 4) {
        u[k] = PYI_V8_SHUFFLE2(t[k], t[k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[k + 1] = PYI_V8_SHUFFLE2(t[k], t[k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        u[k + 2] = PYI_V8_SHUFFLE2(t[k + 1], t[k + 3], 0, 1, 8, 9, 4, 5, 12, 13);
        u[k + 3] = PYI_V8_SHUFFLE2(t[k + 1], t[k + 3], 2, 3, 10, 11, 6, 7, 14, 15);
      }
      for (int k = 0; k < 4; ++k) {
        store(Dst + size_t(c0 + k) * ld + r0, PYI_V8_SHUFFLE2(u[k], u[k + 4], 0, 1, 2, 3, 8, 9, 10, 11));
        store(Dst + size_t(c0 + k + 4) * ld + r0, PYI_V8_SHUFFLE2(u[k], u[k + 4], 4, 5, 6, 7, 12, 13, 14, 15));
      }
    }
}

// The masked, decayed coefficient matrices: A[t][s] = -beta_t e^(G_t - G_s) (k_t . k_s) for s < t, and
// B[t][s] = e^(G_t - G_s) (q_t . k_s) for s <= t; zero above (the products read whole blocks of 4 rows).
PYI_VEC8_CLONES
void decay_masks(float* Akk, float* Aqk, const float* G, const float* beta, int C) {
  for (int t = 0; t < C; ++t) {
    float* a = Akk + size_t(t) * C;
    float* b = Aqk + size_t(t) * C;
    const v8 gt = splat(G[t]), nb = splat(-beta[t]);
    for (int s = 0; s < C; s += 8) {
      const v8 e = exp_nonpositive(gt - load(G + s));  // lanes past t: masked below
      const v8 sv = v8{float(s), float(s + 1), float(s + 2), float(s + 3), float(s + 4), float(s + 5),
                       float(s + 6), float(s + 7)};
      const v8 tv = splat(float(t));
      store(a + s, sv < tv ? nb * e * load(a + s) : splat(0));
      store(b + s, sv <= tv ? e * load(b + s) : splat(0));
    }
  }
}

}  // namespace

PYI_VEC8_CLONES
void delta_rule_chunk(float* M, int S, const DeltaChunk& c, float out_scale, float* scratch) {
  const int C = kDeltaChunk, n = c.n;
  const size_t CS = size_t(C) * size_t(S);
  float* Q = scratch;                // [C][S] l2-normed q (rows < n filled by the caller)
  float* K = Q + CS;                 // [C][S] l2-normed k (rows < n filled by the caller)
  float* KT = K + CS;                // [S][C] K transposed
  float* ST = KT + CS;               // [S][S] the state as S[i][j]
  float* P = ST + size_t(S) * S;     // [C][S] K S0, then the deltas U
  float* R = P + CS;                 // [C][S] Q S0, then the outputs
  float* Akk = R + CS;               // [C][C]
  float* Aqk = Akk + size_t(C) * C;  // [C][C]
  float* G = Aqk + size_t(C) * C;    // [C] cumulative log decay (flat past n: padded tokens decay nothing)
  float* eG = G + C;                 // [C] e^G_t
  float* beta = eG + C;              // [C] (0 past n: padded tokens write nothing)

  // Rows past n are zero tokens (k = q = 0, beta 0, no decay): every product runs whole blocks.
  std::memset(Q + size_t(n) * S, 0, size_t(C - n) * S * sizeof(float));
  std::memset(K + size_t(n) * S, 0, size_t(C - n) * S * sizeof(float));
  float acc = 0.f;
  for (int t = 0; t < C; ++t) {
    acc += t < n ? c.log_decay[t] : 0.f;
    G[t] = acc;
    eG[t] = std::exp(acc);
    beta[t] = t < n ? c.beta[t] : 0.f;
  }
  transpose(K, S, KT, C, C, S);
  transpose(M, S, ST, S, S, S);
  gemm(K, S, ST, S, P, S, C, S, S, nullptr, 0, false, false);  // P[t][j] = (S0^T k_t)_j
  gemm(Q, S, ST, S, R, S, C, S, S, nullptr, 0, false, false);  // R[t][j] = (S0^T q_t)_j
  gemm(K, S, KT, C, Akk, C, C, C, S, nullptr, 0, false, true);
  gemm(Q, S, KT, C, Aqk, C, C, C, S, nullptr, 0, false, true);
  decay_masks(Akk, Aqk, G, beta, C);

  // u_t = beta_t (v_t - e^G_t S0^T k_t) - sum_{s<t} beta_t e^(G_t - G_s) (k_t . k_s) u_s, in place of P: rows in
  // order, each needing the ones before it.
  for (int t = 0; t < C; t += 2) {  // two rows at a time: eight chains of sums, U's rows loaded once for both
    float* u0 = P + size_t(t) * S;
    float* u1 = u0 + S;
    const v8 e0 = splat(eG[t]), b0 = splat(beta[t]), e1 = splat(eG[t + 1]), b1 = splat(beta[t + 1]);
    const float* v0 = t < n ? c.v[t] : nullptr;
    const float* v1 = t + 1 < n ? c.v[t + 1] : nullptr;
    const float* a0 = Akk + size_t(t) * C;
    const float* a1 = a0 + C;
    for (int i = 0; i < S; i += 32) {
      v8 x0[4], x1[4];
      for (int l = 0; l < 4; ++l) {
        x0[l] = ((v0 ? load(v0 + i + 8 * l) : splat(0)) - e0 * load(u0 + i + 8 * l)) * b0;
        x1[l] = ((v1 ? load(v1 + i + 8 * l) : splat(0)) - e1 * load(u1 + i + 8 * l)) * b1;
      }
      for (int s = 0; s < t; ++s) {
        const v8 as0 = splat(a0[s]), as1 = splat(a1[s]);
        const float* us = P + size_t(s) * S + i;
        for (int l = 0; l < 4; ++l) {
          const v8 w = load(us + 8 * l);
          x0[l] += as0 * w;
          x1[l] += as1 * w;
        }
      }
      const v8 a10 = splat(a1[t]);  // row t + 1 reads row t, now done
      for (int l = 0; l < 4; ++l) {
        store(u0 + i + 8 * l, x0[l]);
        store(u1 + i + 8 * l, x1[l] + a10 * x0[l]);
      }
    }
  }
  // o_t = e^G_t S0^T q_t + sum_{s<=t} e^(G_t - G_s) (q_t . k_s) u_s (in place of R).
  gemm(Aqk, C, P, S, R, S, C, S, C, eG, 1, true, false);
  const v8 os = splat(out_scale);
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < S; i += 8) store(c.out[t] + i, load(R + size_t(t) * S + i) * os);
  // S_n[i][j] = e^G_last S0[i][j] + sum_s e^(G_last - G_s) k_s[i] u_s[j]: KT's columns scaled, then one product
  // onto the decayed state.
  float* to_last = Akk;  // e^(G_last - G_s), once per chunk (Akk is read no more)
  for (int s = 0; s < C; s += 8) store(to_last + s, exp_nonpositive(splat(G[C - 1]) - load(G + s)));
  for (int i = 0; i < S; ++i)
    for (int s = 0; s < C; s += 8) {
      float* kt = KT + size_t(i) * C + s;
      store(kt, load(kt) * load(to_last + s));
    }
  gemm(KT, C, P, S, ST, S, S, S, C, eG + C - 1, 0, false, false);
  transpose(ST, S, M, S, S, S);
}

}  // namespace pyinfer
