#include "backends/cpu/sparse_ops.h"

#include <cmath>

#include "kernels/ops_float.h"

namespace pyinfer {

namespace {

// |SiLU(g)| > t as plain comparisons on g: g > hi, or lo < g < mid on SiLU's negative lobe (its minimum
// is -0.2785 at g = -1.2785), found by bisection once per call instead of an exp per neuron.
struct SiluCut {
  float hi, lo, mid;
  explicit SiluCut(float t) {
    auto solve = [t](float a, float b, bool rising) {  // SiLU magnitude crosses t once in [a, b]
      for (int it = 0; it < 40; ++it) {
        const float m = 0.5f * (a + b);
        ((std::fabs(silu(m)) > t) == rising ? b : a) = m;
      }
      return 0.5f * (a + b);
    };
    hi = solve(0.f, 64.f + t, true);
    if (t < 0.2784f) {
      lo = solve(-80.f, -1.2785f, true);
      mid = solve(-1.2785f, 0.f, false);
    } else {
      lo = mid = 0.f;
    }
  }
  bool above(float g) const { return (g > hi) | ((g > lo) & (g < mid)); }
};

const Tensor& src(const Graph& g, const Node& n, int k) { return g.tensors[size_t(n.src[size_t(k)])]; }

}  // namespace

void cpu_active_set(const Graph& g, const Node& n, const RunShape& shape, int ith, int nth) {
  const Tensor& dst = g.tensors[size_t(n.dst)];
  const Tensor& scores = src(g, n, 0);
  const int64_t n_ff = n.i[0], hot = n.i[1];
  int64_t t0, t1;
  thread_share(rows_in_run(dst, shape), ith, nth, 1, t0, t1);  // one token's list is ~1 us of work
  for (int64_t t = t0; t < t1; ++t) {
    const float* s = row_ptr<const float>(scores, t);
    int32_t* list = row_ptr<int32_t>(dst, t);
    int32_t* ids = list + 1;
    int32_t count = 0;
    // Branch-free appends: the outcome is a coin flip at 50% sparsity, so a branch would mispredict.
    if (n.i[2] == 0) {  // predictor logits against per-neuron cut-offs; hot neurons always run
      const float* cut = static_cast<const float*>(src(g, n, 1).data);
      for (int64_t j = 0; j < hot; ++j) ids[count++] = int32_t(j);
      for (int64_t j = 0; j < n_ff - hot; ++j) {
        ids[count] = int32_t(hot + j);
        count += s[j] > cut[j];
      }
    } else if (n.i[3] == 1) {  // gate first (CATS): |SiLU(gate)| > t
      const SiluCut cut(n.f[0]);
      for (int64_t j = 0; j < n_ff; ++j) {
        ids[count] = int32_t(j);
        count += cut.above(s[j]);
      }
    } else {  // threshold on computed activations
      const float thr = n.f[0];
      for (int64_t j = 0; j < n_ff; ++j) {
        ids[count] = int32_t(j);
        count += std::fabs(s[j]) > thr;
      }
    }
    list[0] = count;
  }
}

void cpu_gather_matmul(const KernelTable& k, const Graph& g, const Node& n, const RunShape& shape, int ith,
                       int nth) {
  const Tensor& dst = g.tensors[size_t(n.dst)];
  const Tensor& w = src(g, n, 0);
  const Tensor& x = src(g, n, 1);
  const Tensor& lists = src(g, n, 2);
  for (int64_t t = 0; t < rows_in_run(dst, shape); ++t) {
    const int32_t* list = row_ptr<const int32_t>(lists, t);
    int64_t r0, r1;
    thread_share(list[0], ith, nth, 8, r0, r1);
    if (r0 >= r1) continue;
    MatMulArgs a{w.type, static_cast<const uint8_t*>(w.data), w.row_bytes, w.cols, r0, r1,
                 row_ptr<const uint8_t>(x, t), x.row_bytes, 1, row_ptr<float>(dst, t), dst.cols, list + 1};
    k.matmul(a);
  }
}

void cpu_gated_act(const Graph& g, const Node& n, const RunShape& shape, int ith, int nth) {
  const Tensor& dst = g.tensors[size_t(n.dst)];
  const bool relu = n.i[0] == 1;
  const float thr = n.f[0];
  for (int64_t t = 0; t < rows_in_run(dst, shape); ++t) {
    const float* gate = row_ptr<const float>(src(g, n, 0), t);
    const float* up = row_ptr<const float>(src(g, n, 1), t);
    const int32_t* list = row_ptr<const int32_t>(src(g, n, 2), t);
    float* y = row_ptr<float>(dst, t);
    int64_t k0, k1;
    thread_share(list[0], ith, nth, 16, k0, k1);
    for (int64_t kk = k0; kk < k1; ++kk) {
      const int32_t j = list[1 + kk];
      const float a = (relu ? (gate[j] > 0.f ? gate[j] : 0.f) : silu(gate[j])) * up[j];
      y[j] = std::fabs(a) > thr ? a : 0.f;
    }
  }
}

void cpu_down_axpy(const KernelTable& k, const Graph& g, const Node& n, const RunShape& shape, int ith, int nth,
                   SparseScratch scratch) {
  const Tensor& dst = g.tensors[size_t(n.dst)];
  const Tensor& w = src(g, n, 0);
  // Threads own disjoint column slices of the output, so no two threads ever add into the same float:
  // no race and no reduction pass, and each thread reads one contiguous piece of every active row.
  int64_t c0, c1;
  thread_share(dst.cols, ith, nth, kQuantBlock, c0, c1);
  if (c0 >= c1) return;
  const int32_t* row_map = n.src[4] >= 0 ? static_cast<const int32_t*>(src(g, n, 4).data) : nullptr;
  for (int64_t t = 0; t < rows_in_run(dst, shape); ++t) {
    const float* act = row_ptr<const float>(src(g, n, 1), t);
    const int32_t* list = row_ptr<const int32_t>(src(g, n, 2), t);
    // Every thread builds the same compact list (a few microseconds): cheaper than a barrier to share one.
    int64_t m = 0;
    if (row_map) {  // list ids -> down rows, then ascending rows (Q4T walks 32-neuron groups in order)
      for (int64_t r = 0; r < w.rows; ++r) scratch.dense[r] = 0.f;
      for (int32_t kk = 0; kk < list[0]; ++kk) scratch.dense[row_map[list[1 + kk]]] = act[list[1 + kk]];
      for (int64_t r = 0; r < w.rows; ++r) {
        scratch.ids[m] = int32_t(r);
        scratch.coef[m] = scratch.dense[r];
        m += scratch.dense[r] != 0.f;
      }
    } else {
      for (int32_t kk = 0; kk < list[0]; ++kk) {  // drop neurons the threshold zeroed after the gather
        const int32_t j = list[1 + kk];
        scratch.ids[m] = j;
        scratch.coef[m] = act[j];
        m += act[j] != 0.f;
      }
    }
    float* y = row_ptr<float>(dst, t);
    for (int64_t c = c0; c < c1; ++c) y[c] = 0.f;
    AxpyRowsArgs a{w.type, static_cast<const uint8_t*>(w.data), w.row_bytes, scratch.ids, scratch.coef,
                   m, c0, c1, y};
    if (w.type == DType::Q4T) {
      const Tensor& sc = src(g, n, 3);
      a.scales = static_cast<const uint16_t*>(sc.data);
      a.scales_stride = sc.cols;
      a.tmp = scratch.tmp;
    }
    k.axpy_rows(a);
  }
}

}  // namespace pyinfer
