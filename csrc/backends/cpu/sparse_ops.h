// The CPU side of the neuron-aware FFN ops (graph.h: ActiveSet, gather MatMul, GatedAct, DownAxpy, ...).
// Each function computes thread ith's share of one node; the backend puts a barrier after it.
#pragma once
#include <cstdint>

#include "executor/backend.h"
#include "kernels/kernels.h"

namespace pyinfer {

// The batched down axpy compacts this many tokens' lists at a time, then walks the output in column
// tiles, each tile for every token, so a tile of the rows the tokens share is read from memory once.
constexpr int64_t kAxpyTokens = 16;

// Per-thread memory the sparse ops need, sized by the backend at setup.
struct SparseScratch {
  int32_t* ids;   // [kAxpyTokens, n_ff]: each token's nonzero neurons
  float* coef;    // [kAxpyTokens, n_ff]: their activations
  int64_t stride; // n_ff
  float* dense;   // [n_ff]: activations by down row, to sort a mapped list
};

void cpu_active_set(const Graph& g, const Node& n, const RunShape& shape, int ith, int nth);
void cpu_gather_matmul(const KernelTable& k, const Graph& g, const Node& n, const RunShape& shape, int ith, int nth);
void cpu_gated_act(const Graph& g, const Node& n, const RunShape& shape, int ith, int nth);
// Thread 0 alone (a few microseconds); mark: [n_ff] scratch.
void cpu_active_union(const Graph& g, const Node& n, const RunShape& shape, int ith, int32_t* mark);
void cpu_down_axpy(const KernelTable& k, const Graph& g, const Node& n, const RunShape& shape, int ith, int nth,
                   SparseScratch scratch);

// Row `row` of a tensor (or view), as T*.
template <typename T>
T* row_ptr(const Tensor& t, int64_t row) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(t.data) + row * int64_t(t.row_stride));
}

// Floats from one row of an F32 tensor to the next (a view of some columns has wider rows than its own).
inline int64_t f32_stride(const Tensor& t) { return int64_t(t.row_stride / sizeof(float)); }

// The row pointer table of a paged weight (offload/neuron_store.h), or nullptr for a contiguous one.
inline const uint8_t* const* weight_rows(const Tensor& w) {
  return w.paged ? static_cast<const uint8_t* const*>(w.data) : nullptr;
}

// Contiguous share [begin, end) of n items for thread ith, in multiples of `align`.
inline void thread_share(int64_t n, int ith, int nth, int64_t align, int64_t& begin, int64_t& end) {
  const int64_t units = (n + align - 1) / align;
  const int64_t per = units / nth, extra = units % nth;
  const int64_t u0 = ith * per + (ith < extra ? ith : extra);
  const int64_t u1 = u0 + per + (ith < extra ? 1 : 0);
  begin = n < u0 * align ? n : u0 * align;
  end = n < u1 * align ? n : u1 * align;
}

}  // namespace pyinfer
