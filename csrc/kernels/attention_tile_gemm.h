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

// Rows [r, r + W) once their P^T columns hold exp(s - m_new) and sum their sums: l = l alpha + sum, m = m_new,
// and alpha[r ..] the factor each row's accumulator must be scaled by.
template <class S>
inline void softmax_state(const AttnTileArgs& a, int64_t r, typename S::V m_new, typename S::V sum, float* alpha) {
  using V = typename S::V;
  const V m_old = S::load(a.m + r);
  // A row that has seen no key yet keeps m = -inf: its factor is 1 (exp(-inf - -inf) would be NaN).
  const V al = S::select(S::below(m_new, S::set1(-FLT_MAX)), S::set1(1.f), S::exp(S::sub(m_old, m_new)));
  S::store(a.l + r, S::fmadd(S::load(a.l + r), al, sum));
  S::store(a.m + r, m_new);
  S::store(alpha + r, al);
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
  softmax_state<S>(a, r, m_new, sum, alpha);
}

// Where P lives: row r's weight of key j is p[j * pj + r * pi] (P^T: pj = padded rows, pi = 1; the key-lane
// tile's row-major P: pj = 1, pi = kAttnKeyTile).
struct PLayout {
  const float* p;
  int64_t pj, pi;
  const float* row(int64_t r) const { return p + r * pi; }
};

// x[i] += P[i][j] V[j][d, d + DV W) for j in [j0, j1), i < RB (x: RB rows of DV vectors, p: the first row's).
template <class S, int RB, int DV>
inline void accumulate_keys(typename S::V (*x)[DV], const AttnTileArgs& a, const float* p, const PLayout& P,
                            int d, int j0, int j1) {
  using V = typename S::V;
  constexpr int W = S::W;
  const int vd = attn_v_dim(a);
  for (int j = j0; j < j1; ++j) {
    const float* v = a.v + int64_t(j) * vd + d;
    V vv[DV];
    for (int dv = 0; dv < DV; ++dv) vv[dv] = S::load(v + dv * W);
    for (int i = 0; i < RB; ++i) {
      const V w = S::set1(p[int64_t(j) * P.pj + i * P.pi]);
      for (int dv = 0; dv < DV; ++dv) x[i][dv] = S::fmadd(w, vv[dv], x[i][dv]);
    }
  }
}

// Rows [r, r + RB), dims [d, d + DV W): acc = acc * alpha + P V over each row's own keys.
template <class S, int RB, int DV>
void accumulate(const AttnTileArgs& a, int64_t r, int d, const PLayout& P, const float* alpha) {
  using V = typename S::V;
  constexpr int W = S::W;
  const int vd = attn_v_dim(a);
  V x[RB][DV];
  for (int i = 0; i < RB; ++i) {
    const V al = S::set1(alpha[r + i]);
    for (int dv = 0; dv < DV; ++dv) x[i][dv] = S::mul(S::load(a.acc + (r + i) * vd + d + dv * W), al);
  }
  int c0 = 0, c1 = kAttnKeyTile;  // keys every row sees
  for (int i = 0; i < RB; ++i) c0 = std::max(c0, a.lo[r + i]), c1 = std::min(c1, a.hi[r + i]);
  const float* p = P.row(r);
  if (c0 < c1) {  // each row's keys in ascending order, whatever rows share the tile: below the shared range,
                  // the shared range, above it (lo <= c0 and hi >= c1)
    for (int i = 0; i < RB; ++i) accumulate_keys<S, 1, DV>(&x[i], a, P.row(r + i), P, d, a.lo[r + i], c0);
    accumulate_keys<S, RB, DV>(x, a, p, P, d, c0, c1);
    for (int i = 0; i < RB; ++i) accumulate_keys<S, 1, DV>(&x[i], a, P.row(r + i), P, d, c1, a.hi[r + i]);
  } else {
    for (int i = 0; i < RB; ++i)
      accumulate_keys<S, 1, DV>(&x[i], a, P.row(r + i), P, d, a.lo[r + i], a.hi[r + i]);
  }
  for (int i = 0; i < RB; ++i)
    for (int dv = 0; dv < DV; ++dv) S::store(a.acc + (r + i) * vd + d + dv * W, x[i][dv]);
}

template <class S, int RB, int DV>
void accumulate_rows(const AttnTileArgs& a, int64_t r, const PLayout& P, const float* alpha) {
  constexpr int W = S::W;
  int d = 0;
  const int vd = attn_v_dim(a);
  for (; d + DV * W <= vd; d += DV * W) accumulate<S, RB, DV>(a, r, d, P, alpha);
  for (; d < vd; d += W) accumulate<S, RB, 1>(a, r, d, P, alpha);
}

// P V for every row of the block, once P and alpha are written. RB x DV: rows x value vectors.
template <class S, int RB, int DV>
void accumulate_all(const AttnTileArgs& a, const PLayout& P, const float* alpha) {
  int64_t r = 0;
  for (; r + RB <= a.rows; r += RB) accumulate_rows<S, RB, DV>(a, r, P, alpha);
  for (; r + 2 <= a.rows; r += 2) accumulate_rows<S, 2, DV>(a, r, P, alpha);
  for (; r < a.rows; ++r) accumulate_rows<S, 1, DV>(a, r, P, alpha);
}

// The keys any row of the block sees: [j0, j1), empty when none.
inline void key_range(const AttnTileArgs& a, int& j0, int& j1) {
  j0 = kAttnKeyTile, j1 = 0;
  for (int64_t r = 0; r < a.rows; ++r)
    if (a.lo[r] < a.hi[r]) j0 = std::min(j0, a.lo[r]), j1 = std::max(j1, a.hi[r]);
}

// One key tile for a block of rows (head_dim and v_dim multiples of S::W). KB x RV: the score register tile (keys x
// row vectors); RB x DV: the P V tile (rows x value vectors).
template <class S, int KB, int RV, int RB, int DV>
void tile(const AttnTileArgs& a) {
  static_assert(kAttnRowPad % S::W == 0, "row padding holds whole vectors");
  const int64_t rw = attn_padded_rows(a.rows);
  float* st = a.scores;                                 // [n_keys, rw]: S^T, then P^T
  float* alpha = a.scores + int64_t(kAttnKeyTile) * rw;  // [rw]
  int j0, j1;
  key_range(a, j0, j1);
  if (j0 >= j1) return;
  all_scores<S, KB, RV>(a, j0, j1, rw, st);
  for (int64_t r = 0; r < a.rows; r += S::W) softmax<S>(a, r, rw, st, alpha);
  accumulate_all<S, RB, DV>(a, PLayout{st, rw, 1}, alpha);
}

// Decode's few rows would leave most lanes of a row vector idle. Here the keys fill the lanes instead: with the
// keys transposed once into a.kt, each row's scores are the same fma chains over d that scores() runs, its
// exponentials the same S::exp, its sum the same adds in the same order and its state the same fma, so a token
// gets the same numbers in a batch of any size. Its P (row-major here) then goes to the same P V.

// sr[i][0 .. N W) = scores of rows r .. r + QR against keys [0, N W), from kt.
template <class S, int QR, int N>
inline void key_lane_scores(const AttnTileArgs& a, int64_t r, float* sr) {
  using V = typename S::V;
  constexpr int W = S::W;
  const int hd = a.head_dim;
  V c[QR][N];
  for (int i = 0; i < QR; ++i)
    for (int n = 0; n < N; ++n) c[i][n] = S::zero();
  const float* q = a.q + r * hd;
  const float* kt = a.kt;
  for (int d = 0; d < hd; ++d, kt += kAttnKeyTile) {
    V k[N];
    for (int n = 0; n < N; ++n) k[n] = S::load(kt + n * W);
    for (int i = 0; i < QR; ++i) {
      const V qq = S::set1(q[i * hd + d]);
      for (int n = 0; n < N; ++n) c[i][n] = S::fmadd(k[n], qq, c[i][n]);
    }
  }
  for (int i = 0; i < QR; ++i)
    for (int n = 0; n < N; ++n) S::store(sr + i * kAttnKeyTile + n * W, c[i][n]);
}

// Rows r .. r + QR: each row's scores s (row-major, kAttnKeyTile apart) become exp(s - m_new) on its keys and 0
// elsewhere in [0, N W), and its state is updated as softmax_state() does it; alpha[r ..]: the factors its
// accumulator must be scaled by. The max is exact in any order, so it runs on vectors; each row's sum must add
// its keys one by one in ascending order (the prefill tile's order; the zeros outside a row's keys change no
// sum of non-negative terms), so the rows' sums run as interleaved chains instead of one after another.
template <class S, int QR, int N>
inline void key_lane_softmax(const AttnTileArgs& a, int64_t r, float* p, float* alpha) {
  using V = typename S::V;
  constexpr int W = S::W, NW = N * W;
  int jlo = NW, jhi = 0;  // keys any of the rows sees
  for (int i = 0; i < QR; ++i) {
    const int lo = a.lo[r + i], hi = a.hi[r + i];
    if (lo >= hi) continue;
    jlo = std::min(jlo, lo), jhi = std::max(jhi, hi);
    float* s = p + i * kAttnKeyTile;
    std::fill(s, s + lo, -INFINITY);  // lanes outside the row's keys (past the last key: unset kt lanes)
    std::fill(s + hi, s + NW, -INFINITY);
    V vm = S::load(s);
    for (int n = 1; n < N; ++n) vm = S::max(vm, S::load(s + n * W));
    alignas(64) float lanes[W];
    S::store(lanes, vm);
    float mx = lanes[0];
    for (int l = 1; l < W; ++l) mx = std::max(mx, lanes[l]);
    const float m_new = std::max(a.m[r + i], mx);
    const V vmn = S::set1(m_new);
    for (int n = lo / W; n < (hi + W - 1) / W; ++n) S::store(s + n * W, S::exp(S::sub(S::load(s + n * W), vmn)));
    std::fill(s, s + lo, 0.f);
    std::fill(s + hi, s + NW, 0.f);
    alpha[r + i] = m_new;  // until the state update below
  }
  float sum[QR] = {};
  for (int j = jlo; j < jhi; ++j)
    for (int i = 0; i < QR; ++i) sum[i] += p[i * kAttnKeyTile + j];
  for (int i = 0; i < QR; ++i) {
    if (a.lo[r + i] >= a.hi[r + i]) {  // no key here: m, l unchanged, factor 1 (exp(0) is exactly 1 there too)
      alpha[r + i] = 1.f;
      continue;
    }
    const float m_old = a.m[r + i], m_new = alpha[r + i];
    alignas(64) float e[W];
    S::store(e, S::exp(S::set1(m_old - m_new)));
    const float al = m_new < -FLT_MAX ? 1.f : e[0];
    a.l[r + i] = std::fma(a.l[r + i], al, sum[i]);
    a.m[r + i] = m_new;
    alpha[r + i] = al;
  }
}

// Scores of every row against keys [0, N W), QR rows sharing each kt load, then their softmax, up to 4 rows'
// sums at a time; P row-major in p.
template <class S, int QR, int N>
void key_lane_rows(const AttnTileArgs& a, float* p, float* alpha) {
  static_assert(QR >= 1 && QR <= 4, "a group of up to 4 rows, the rest in one smaller group");
  int64_t r = 0;
  for (; r + QR <= a.rows; r += QR) key_lane_scores<S, QR, N>(a, r, p + r * kAttnKeyTile);
  switch (a.rows - r) {  // GQA groups of 3 heads stay one group
    case 3: if constexpr (QR > 3) key_lane_scores<S, 3, N>(a, r, p + r * kAttnKeyTile); break;
    case 2: if constexpr (QR > 2) key_lane_scores<S, 2, N>(a, r, p + r * kAttnKeyTile); break;
    case 1: if constexpr (QR > 1) key_lane_scores<S, 1, N>(a, r, p + r * kAttnKeyTile); break;
    default: break;
  }
  for (r = 0; r + 4 <= a.rows; r += 4) key_lane_softmax<S, 4, N>(a, r, p + r * kAttnKeyTile, alpha);
  switch (a.rows - r) {
    case 3: key_lane_softmax<S, 3, N>(a, r, p + r * kAttnKeyTile, alpha); break;
    case 2: key_lane_softmax<S, 2, N>(a, r, p + r * kAttnKeyTile, alpha); break;
    case 1: key_lane_softmax<S, 1, N>(a, r, p + r * kAttnKeyTile, alpha); break;
    default: break;
  }
}

// As tile(), for blocks of fewer than kAttnGemmRows rows (a.kt given; keys zero-padded to kAttnKeyPad).
// S::transpose_keys(k, head_dim, n, kt) fills kt. QR: rows sharing each kt load; RB x DV: the P V tile.
template <class S, int QR, int RB, int DV>
void key_lane_tile(const AttnTileArgs& a) {
  constexpr int W = S::W, N = kAttnKeyTile / W;
  static_assert(kAttnKeyTile % W == 0 && kAttnKeyPad % W == 0 && N <= 8, "whole vectors of keys");
  float* p = a.scores;  // [rows, kAttnKeyTile]: scores, then P
  float* alpha = a.scores + int64_t(kAttnKeyTile) * attn_padded_rows(a.rows);
  int j0, j1;
  key_range(a, j0, j1);
  if (j0 >= j1) return;
  S::transpose_keys(a.k, a.head_dim, (j1 + kAttnKeyPad - 1) / kAttnKeyPad * kAttnKeyPad, a.kt);
  switch ((j1 + W - 1) / W) {  // key vectors that cover every row's keys
    case 1: key_lane_rows<S, QR, 1>(a, p, alpha); break;
    case 2: key_lane_rows<S, QR, 2>(a, p, alpha); break;
    case 3: key_lane_rows<S, QR, 3>(a, p, alpha); break;
    case 4: key_lane_rows<S, QR, 4>(a, p, alpha); break;
    case 5: key_lane_rows<S, QR, (N >= 5 ? 5 : 1)>(a, p, alpha); break;
    case 6: key_lane_rows<S, QR, (N >= 6 ? 6 : 1)>(a, p, alpha); break;
    case 7: key_lane_rows<S, QR, (N >= 7 ? 7 : 1)>(a, p, alpha); break;
    default: key_lane_rows<S, QR, N>(a, p, alpha); break;
  }
  accumulate_all<S, RB, DV>(a, PLayout{p, 1, kAttnKeyTile}, alpha);
}

}  // namespace pyinfer::attn_gemm
