// The tiled attention's key tile as two small matrix products, for blocks of many query rows (prefill).
//
// Scores are computed transposed, S^T = K Q^T, from the block's queries transposed once per item
// (AttnTileArgs::qt): a register tile of keys x row-vectors, each key element broadcast and each qt load
// serving several keys. The online softmax then runs down the columns of S^T with each row's max, sum and
// key range in vector lanes, so no horizontal reduction is left. acc += P V is a register tile of rows x
// value vectors, each V load serving several rows. The dot-product form (attention_avx2.cpp) stays for decode,
// whose few rows would not repay the transposes.
//
// A row never multiplies a key outside its own range: where the rows of a register tile disagree, the keys
// only some of them see are added row by row (a masked weight of 0 times an inf value would be NaN).
//
// A row vector of W lanes covers rows up to the next multiple of W (at most kAttnRowPad), so decode's few rows
// cost one vector on 4-lane NEON, where this tile serves every block.
//
// Included by the per-ISA files with their SIMD traits S:
//   V, I (float and int32 vectors), M (lane mask), W (lanes);
//   load, store, set1, zero, fmadd, mul, add, sub, max, exp; loadi, set1i;
//   visible(j, lo, hi): lanes with lo <= j < hi; select(mask, x, fill); below(x, y): lanes with x < y.
#pragma once
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kernels/attention.h"

namespace pyinfer::attn_gemm {

// St[j .. j + KB)[r0 .. r0 + RV W) = K[j .. j + KB) . Qt[:, r0 .. r0 + RV W)
template <class S, int KB, int RV>
inline void scores(const AttnTileArgs& a, int j, int64_t r0, int64_t rw, float* st) {
  using V = typename S::V;
  constexpr int W = S::W;
  const int hd = a.head_dim;
  V c[KB][RV];
  for (int kb = 0; kb < KB; ++kb)
    for (int rv = 0; rv < RV; ++rv) c[kb][rv] = S::zero();
  const float* k = a.k + int64_t(j) * hd;
  const float* qt = a.qt + r0;
  for (int d = 0; d < hd; ++d, qt += rw) {
    V q[RV];
    for (int rv = 0; rv < RV; ++rv) q[rv] = S::load(qt + rv * W);
    for (int kb = 0; kb < KB; ++kb) {
      const V kk = S::set1(k[kb * hd + d]);
      for (int rv = 0; rv < RV; ++rv) c[kb][rv] = S::fmadd(kk, q[rv], c[kb][rv]);
    }
  }
  for (int kb = 0; kb < KB; ++kb)
    for (int rv = 0; rv < RV; ++rv) S::store(st + int64_t(j + kb) * rw + r0 + rv * W, c[kb][rv]);
}

// Keys [j0, j1) against the row vectors that hold the block's rows (padding lanes past them are zero).
template <class S, int KB, int RV>
void all_scores(const AttnTileArgs& a, int j0, int j1, int64_t rw, float* st) {
  constexpr int W = S::W;
  const int64_t vecs = (a.rows + W - 1) / W;
  int j = j0;
  for (; j + KB <= j1; j += KB) {
    int64_t v = 0;
    for (; v + RV <= vecs; v += RV) scores<S, KB, RV>(a, j, v * W, rw, st);
    for (; v < vecs; ++v) scores<S, KB, 1>(a, j, v * W, rw, st);
  }
  for (; j < j1; ++j) {
    int64_t v = 0;
    for (; v + RV <= vecs; v += RV) scores<S, 1, RV>(a, j, v * W, rw, st);
    for (; v < vecs; ++v) scores<S, 1, 1>(a, j, v * W, rw, st);
  }
}

// Rows [r, r + W): scores over their keys become exp(s - m_new), zero outside each row's range; m and l are
// updated and the factor each row's accumulator must be scaled by is stored at alpha[r ..].
template <class S>
void softmax(const AttnTileArgs& a, int64_t r, int64_t rw, float* st, float* alpha) {
  using V = typename S::V;
  using I = typename S::I;
  constexpr int W = S::W;
  int j0 = kAttnKeyTile, j1 = 0;  // keys any of the W rows sees
  for (int i = 0; i < W; ++i)
    if (a.lo[r + i] < a.hi[r + i]) j0 = std::min(j0, a.lo[r + i]), j1 = std::max(j1, a.hi[r + i]);
  const I lo = S::loadi(a.lo + r), hi = S::loadi(a.hi + r);
  const V ninf = S::set1(-INFINITY), m_old = S::load(a.m + r);
  V mx = ninf;
  for (int j = j0; j < j1; ++j) mx = S::max(mx, S::select(S::visible(j, lo, hi), S::load(st + int64_t(j) * rw + r), ninf));
  const V m_new = S::max(m_old, mx);
  V sum = S::zero();
  for (int j = j0; j < j1; ++j) {
    float* s = st + int64_t(j) * rw + r;
    const V p = S::select(S::visible(j, lo, hi), S::exp(S::sub(S::load(s), m_new)), S::zero());
    S::store(s, p);
    sum = S::add(sum, p);
  }
  // A row that has seen no key yet keeps m = -inf: its factor is 1 (exp(-inf - -inf) would be NaN).
  const V al = S::select(S::below(m_new, S::set1(-FLT_MAX)), S::set1(1.f), S::exp(S::sub(m_old, m_new)));
  S::store(a.l + r, S::fmadd(S::load(a.l + r), al, sum));
  S::store(a.m + r, m_new);
  S::store(alpha + r, al);
}

// x[i] += p[j][i] V[j][d, d + DV W) for j in [j0, j1), i < RB (x: RB rows of DV vectors, p: P^T's column of
// the first row).
template <class S, int RB, int DV>
inline void accumulate_keys(typename S::V (*x)[DV], const AttnTileArgs& a, const float* p, int64_t rw,
                            int d, int j0, int j1) {
  using V = typename S::V;
  constexpr int W = S::W;
  const int hd = a.head_dim;
  for (int j = j0; j < j1; ++j) {
    const float* v = a.v + int64_t(j) * hd + d;
    V vv[DV];
    for (int dv = 0; dv < DV; ++dv) vv[dv] = S::load(v + dv * W);
    for (int i = 0; i < RB; ++i) {
      const V w = S::set1(p[int64_t(j) * rw + i]);
      for (int dv = 0; dv < DV; ++dv) x[i][dv] = S::fmadd(w, vv[dv], x[i][dv]);
    }
  }
}

// Rows [r, r + RB), dims [d, d + DV W): acc = acc * alpha + P V over each row's own keys.
template <class S, int RB, int DV>
void accumulate(const AttnTileArgs& a, int64_t r, int d, int64_t rw, const float* st, const float* alpha) {
  using V = typename S::V;
  constexpr int W = S::W;
  const int hd = a.head_dim;
  V x[RB][DV];
  for (int i = 0; i < RB; ++i) {
    const V al = S::set1(alpha[r + i]);
    for (int dv = 0; dv < DV; ++dv) x[i][dv] = S::mul(S::load(a.acc + (r + i) * hd + d + dv * W), al);
  }
  int c0 = 0, c1 = kAttnKeyTile;  // keys every row sees
  for (int i = 0; i < RB; ++i) c0 = std::max(c0, a.lo[r + i]), c1 = std::min(c1, a.hi[r + i]);
  const float* p = st + r;
  if (c0 < c1) {
    accumulate_keys<S, RB, DV>(x, a, p, rw, d, c0, c1);
    for (int i = 0; i < RB; ++i) {  // each row's keys outside the shared range (lo <= c0 and hi >= c1)
      accumulate_keys<S, 1, DV>(&x[i], a, p + i, rw, d, a.lo[r + i], c0);
      accumulate_keys<S, 1, DV>(&x[i], a, p + i, rw, d, c1, a.hi[r + i]);
    }
  } else {
    for (int i = 0; i < RB; ++i) accumulate_keys<S, 1, DV>(&x[i], a, p + i, rw, d, a.lo[r + i], a.hi[r + i]);
  }
  for (int i = 0; i < RB; ++i)
    for (int dv = 0; dv < DV; ++dv) S::store(a.acc + (r + i) * hd + d + dv * W, x[i][dv]);
}

template <class S, int RB, int DV>
void accumulate_rows(const AttnTileArgs& a, int64_t r, int64_t rw, const float* st, const float* alpha) {
  constexpr int W = S::W;
  int d = 0;
  for (; d + DV * W <= a.head_dim; d += DV * W) accumulate<S, RB, DV>(a, r, d, rw, st, alpha);
  for (; d < a.head_dim; d += W) accumulate<S, RB, 1>(a, r, d, rw, st, alpha);
}

// One key tile for a block of rows (head_dim a multiple of S::W). KB x RV: the score register tile (keys x
// row vectors); RB x DV: the P V tile (rows x value vectors).
template <class S, int KB, int RV, int RB, int DV>
void tile(const AttnTileArgs& a) {
  constexpr int W = S::W;
  static_assert(kAttnRowPad % W == 0, "row padding holds whole vectors");
  const int64_t rw = attn_padded_rows(a.rows);
  float* st = a.scores;                                 // [n_keys, rw]: S^T, then P^T
  float* alpha = a.scores + int64_t(kAttnKeyTile) * rw;  // [rw]
  int j0 = kAttnKeyTile, j1 = 0;
  for (int64_t r = 0; r < a.rows; ++r)
    if (a.lo[r] < a.hi[r]) j0 = std::min(j0, a.lo[r]), j1 = std::max(j1, a.hi[r]);
  if (j0 >= j1) return;
  all_scores<S, KB, RV>(a, j0, j1, rw, st);
  for (int64_t r = 0; r < a.rows; r += W) softmax<S>(a, r, rw, st, alpha);
  int64_t r = 0;
  for (; r + RB <= a.rows; r += RB) accumulate_rows<S, RB, DV>(a, r, rw, st, alpha);
  for (; r < a.rows; ++r) accumulate_rows<S, 1, DV>(a, r, rw, st, alpha);
}

}  // namespace pyinfer::attn_gemm
