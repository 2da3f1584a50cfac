// How every ISA walks the active neurons of a down axpy; the ISA files supply only the arithmetic.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/kernels.h"
#include "kernels/prefetch.h"

namespace pyinfer {
// Internal linkage: each ISA file gets its own copy, compiled with its own flags (with one shared inline copy,
// an unoptimised build could link an AVX2 copy into the scalar path).
namespace {

// Rows [begin, end) of the active list in fours (one load/store of the output slice per four rows),
// then one by one.
template <typename Four, typename One>
inline void for_rows_by4(int64_t begin, int64_t end, Four four, One one) {
  int64_t k = begin;
  for (; k + 4 <= end; k += 4) four(k);
  for (; k < end; ++k) one(k);
}

// The NN active rows at list positions [k, k + NN), as pointers to their blocks.
template <typename Block, int NN>
inline std::array<const Block*, NN> active_rows(const AxpyRowsArgs& a, int64_t k) {
  std::array<const Block*, NN> rows;
  for (int i = 0; i < NN; ++i) rows[size_t(i)] = reinterpret_cast<const Block*>(a.row(a.ids[k + i]));
  return rows;
}

// Q4T: the active rows (ascending) of one 32-neuron group share its scales and offsets.
struct Q4TGroup {
  int32_t group;      // neuron id / 32
  int64_t begin, end; // its rows in the active list
  float coef_sum;     // sum of their activations: what the shared offsets are multiplied by
};

template <typename F>
inline void for_each_q4t_group(const AxpyRowsArgs& a, F f) {
  for (int64_t k = 0; k < a.n;) {
    Q4TGroup g{a.ids[k] / kQuantBlock, k, k, 0.f};
    while (g.end < a.n && a.ids[g.end] / kQuantBlock == g.group) g.coef_sum += a.coef[g.end++];
    f(g);
    k = g.end;
  }
}

// A Q4T group's coefficients as two int8 digits, c ~= d * q + d_lo * q_lo (d = amax / 127, d_lo = d / 254;
// rounded half to even), so that every ISA sums nibble x coefficient products exactly, in integers, and all
// ISAs agree bit for bit: y += scale * (d * sum_j q_j n_j + d_lo * sum_j q_lo_j n_j) + offset * sum_j c_j, each
// step a fused multiply-add. Converting every nibble to float made the float axpy cost twice a dense GEMV's
// integer dots (AVX2, bench/results/q4t_axpy_int8.md); one int8 digit alone cost SmolLM2's sparse path +0.7%
// perplexity, the second brings the coefficients to within 1/64,000 of their largest. A group's ids are
// distinct, so it has at most 32 entries; both digit arrays are padded with zeros to a multiple of 4.
struct Q4TCoefs {
  float d, d_lo;
  int64_t n4;  // entries, rounded up to a multiple of 4
  int8_t q[kQuantBlock], q_lo[kQuantBlock];
};

inline void quantize_group_coefs(const AxpyRowsArgs& a, const Q4TGroup& g, Q4TCoefs& out) {
  const int64_t n = g.end - g.begin;
  float amax = 0.f;
  for (int64_t k = 0; k < n; ++k) amax = std::fmax(amax, std::fabs(a.coef[g.begin + k]));
  // Below 1e-30 (or not finite) a group adds nothing; the clamps keep every cast to int8 defined, NaN included.
  const float id = amax > 1e-30f && amax <= 3e38f ? 127.f / amax : 0.f, id_lo = id * 254.f;
  out.d = amax / 127.f;
  out.d_lo = out.d / 254.f;
  for (int64_t k = 0; k < n; ++k) {  // n <= 32: a group's ids are distinct (compact_token)
    const float c = a.coef[g.begin + k], q = std::fmax(-127.f, std::fmin(127.f, std::nearbyint(c * id)));
    const float rest = std::fma(-q, out.d, c);  // fused on every ISA: the same residual everywhere
    out.q[k] = int8_t(q);
    out.q_lo[k] = int8_t(std::fmax(-127.f, std::fmin(127.f, std::nearbyint(rest * id_lo))));
  }
  out.n4 = (n + 3) & ~int64_t(3);
  for (int64_t k = n; k < out.n4; ++k) out.q[k] = out.q_lo[k] = 0;
}

// The group's row pointers, padded like its coefficients (with its first row: a zero coefficient adds nothing).
inline void group_rows(const AxpyRowsArgs& a, const Q4TGroup& g, int64_t n4, const uint8_t** rows) {
  for (int64_t k = 0; k < n4; ++k) rows[k] = a.row(a.ids[g.begin + (g.begin + k < g.end ? k : 0)]);
}

// Active rows are scattered, which the hardware prefetcher cannot follow: before rows [k, k + 4) are computed,
// this thread's slice of the rows kAxpyAheadRows further down the list is asked for (into L2). Without it a
// Q8_0 down axpy over 39% of Qwen2.5-0.5B's neurons (476-byte slices per thread) took 2.2x the dense down's
// time; the Q4T walk prefetches a group ahead instead.
constexpr int64_t kAxpyAheadRows = 24;
// ... or as many rows as kAxpyAheadBytes of this thread's slices hold, where that is more: a group's rows are
// read together (up to 32 of them, a column chunk at a time), so the distance must reach past the next group.
constexpr int64_t kAxpyAheadBytes = 96 << 10;
inline int64_t axpy_ahead_rows(int64_t slice_bytes) {
  return std::max(kAxpyAheadRows, kAxpyAheadBytes / std::max<int64_t>(slice_bytes, 1));
}

template <typename Block>
inline void prefetch_slice(const AxpyRowsArgs& a, int64_t k) {
  const int64_t bytes = (a.c1 - a.c0) / kQuantBlock * int64_t(sizeof(Block));
  const char* p = reinterpret_cast<const char*>(a.row(a.ids[k])) + a.c0 / kQuantBlock * int64_t(sizeof(Block));
  for (int64_t off = 0; off < bytes; off += 64) prefetch_l2(p + off);
}

template <typename Block, typename Four, typename One>
inline void for_rows_prefetched(const AxpyRowsArgs& a, Four four, One one) {
  int64_t ahead = 0;  // the first list position not yet asked for
  const int64_t distance = axpy_ahead_rows((a.c1 - a.c0) / kQuantBlock * int64_t(sizeof(Block)));
  const auto ask = [&](int64_t upto) {
    for (upto = std::min(upto, a.n); ahead < upto; ++ahead) prefetch_slice<Block>(a, ahead);
  };
  for_rows_by4(0, a.n, [&](int64_t k) { ask(k + 4 + distance); four(k); },
               [&](int64_t k) { ask(k + 1 + distance); one(k); });
}

// An ISA's entry point: Q4T, Q4_1 and Q8_0 by its kernels (q41 / q80 take a row index and the rows per
// call as std::integral_constant<int, 4 or 1>), every other type by the reference.
template <typename Q4T, typename Q41, typename Q80>
inline void axpy_dispatch(const AxpyRowsArgs& a, Q4T q4t, Q41 q41, Q80 q80) {
  using Four = std::integral_constant<int, 4>;
  using One = std::integral_constant<int, 1>;
  switch (a.wtype) {
    case DType::Q4T: return q4t(a);
    case DType::Q4_1:
      return for_rows_prefetched<BlockQ4_1>(a, [&](int64_t k) { q41(k, Four{}); }, [&](int64_t k) { q41(k, One{}); });
    case DType::Q8_0:
      return for_rows_prefetched<BlockQ8_0>(a, [&](int64_t k) { q80(k, Four{}); }, [&](int64_t k) { q80(k, One{}); });
    default: return axpy_rows_scalar(a);
  }
}

}  // namespace
}  // namespace pyinfer
