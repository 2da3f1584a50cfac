// How every ISA walks the active neurons of a down axpy; the ISA files supply only the arithmetic.
#pragma once
#include <array>
#include <cstdint>
#include <type_traits>

#include "kernels/kernels.h"

namespace pyinfer {

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

// An ISA's entry point: Q4T, Q4_1 and Q8_0 by its kernels (q41 / q80 take a row index and the rows per
// call as std::integral_constant<int, 4 or 1>), every other type by the reference.
template <typename Q4T, typename Q41, typename Q80>
inline void axpy_dispatch(const AxpyRowsArgs& a, Q4T q4t, Q41 q41, Q80 q80) {
  using Four = std::integral_constant<int, 4>;
  using One = std::integral_constant<int, 1>;
  switch (a.wtype) {
    case DType::Q4T: return q4t(a);
    case DType::Q4_1: return for_rows_by4(0, a.n, [&](int64_t k) { q41(k, Four{}); }, [&](int64_t k) { q41(k, One{}); });
    case DType::Q8_0: return for_rows_by4(0, a.n, [&](int64_t k) { q80(k, Four{}); }, [&](int64_t k) { q80(k, One{}); });
    default: return axpy_rows_scalar(a);
  }
}

}  // namespace pyinfer
