#include "backends/cpu/sparse_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/ops_float.h"

namespace pyinfer {

namespace {

const Tensor& src(const Graph& g, const Node& n, int k) { return g.tensors[size_t(n.src[size_t(k)])]; }

// The cut t for which |s| > t keeps the k largest |s| (ties with the k-th kept too): just below the k-th largest.
// |s| as its bits orders as an unsigned integer; a histogram of the top 11 bits (exponent and 3 mantissa bits)
// finds the bucket that holds the k-th largest, and only that bucket is ordered (std::nth_element over all 8,960
// of a 1.5B's down inputs cost ~40 us a layer, as much as the rows it saved). A NaN counts as 0 (an ordering with
// NaN in it is no ordering). Per-thread buffers, grown once.
float kth_largest_magnitude(const float* s, int64_t n, int64_t k) {
  constexpr int kBuckets = 2048;
  thread_local std::vector<uint32_t> bits, bucket;
  bits.resize(size_t(n));
  int64_t count[kBuckets] = {};
  for (int64_t j = 0; j < n; ++j) {
    uint32_t b;
    const float m = std::fabs(s[j]);
    std::memcpy(&b, &m, sizeof(b));
    b = b > 0x7f800000u ? 0u : b;  // NaN
    bits[size_t(j)] = b;
    ++count[b >> 20];
  }
  int h = kBuckets - 1;
  int64_t above = 0;  // values in the buckets over h
  for (; h > 0 && above + count[h] < k; --h) above += count[h];
  bucket.clear();
  for (int64_t j = 0; j < n; ++j)
    if (int(bits[size_t(j)] >> 20) == h) bucket.push_back(bits[size_t(j)]);
  const int64_t r = std::min<int64_t>(k - above, int64_t(bucket.size())) - 1;  // its rank within the bucket
  std::nth_element(bucket.begin(), bucket.begin() + r, bucket.end(), std::greater<uint32_t>());
  float v;
  std::memcpy(&v, &bucket[size_t(r)], sizeof(v));
  return std::nextafter(v, -1.f);
}

}  // namespace

void cpu_active_set(const Graph& g, const Node& n, const RunShape& shape, int ith, int nth) {
  const Tensor& dst = g.tensors[size_t(n.dst)];
  const Tensor& scores = src(g, n, ActiveSetSrc::scores);
  const ActiveSetParams& p = n.p.active_set;
  const int64_t n_ff = p.n_ff, hot = p.hot;
  int64_t t0, t1;
  thread_share(rows_in_run(dst, shape), ith, nth, 1, t0, t1);  // one token's list is ~1 us of work
  for (int64_t t = t0; t < t1; ++t) {
    const float* s = row_ptr<const float>(scores, t);
    int32_t* list = row_ptr<int32_t>(dst, t);
    int32_t* ids = list + 1;
    int32_t count = 0;
    // Branch-free appends: the outcome is a coin flip at 50% sparsity, so a branch would mispredict.
    if (p.mode == ActiveSetMode::Predictor) {  // predictor logits against per-neuron cut-offs; hot neurons always run
      const float* cut = static_cast<const float*>(src(g, n, ActiveSetSrc::cut).data);
      for (int64_t j = 0; j < hot; ++j) ids[count++] = int32_t(j);
      for (int64_t j = 0; j < n_ff - hot; ++j) {
        ids[count] = int32_t(hot + j);
        count += s[j] > cut[j];
      }
    } else if (p.gate_fn != GateFn::Identity) {  // gate first (CATS): |act(gate)| > t
      const GateCut cut(p.gate_fn, p.threshold);
      for (int64_t j = 0; j < n_ff; ++j) {
        ids[count] = int32_t(j);
        count += cut.above(s[j]);
      }
    } else {  // threshold on computed activations (or the top_k-th largest |score|: a fixed density)
      const float thr = p.top_k > 0 ? kth_largest_magnitude(s, n_ff, p.top_k) : p.threshold;
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
  const Tensor& w = src(g, n, MatMulSrc::weight);
  const Tensor& x = src(g, n, MatMulSrc::x);
  const Tensor& lists = src(g, n, MatMulSrc::active);
  // A shared list (a batch's union) is one call over every token: each listed row is read once.
  const bool shared = lists.row_mode == RowMode::Fixed;
  const int64_t n_tok = rows_in_run(dst, shape);
  for (int64_t t = 0; t < (shared ? 1 : n_tok); ++t) {
    const int32_t* list = row_ptr<const int32_t>(lists, t);
    int64_t r0, r1;
    thread_share(list[0], ith, nth, 8, r0, r1);
    if (r0 >= r1) continue;
    MatMulArgs a{w.type, static_cast<const uint8_t*>(w.data), w.row_stride, w.cols, r0, r1,
                 row_ptr<const uint8_t>(x, t), x.row_stride, shared ? n_tok : 1, row_ptr<float>(dst, t),
                 f32_stride(dst), list + 1};
    a.w_rows = weight_rows(w);
    k.matmul(a);
  }
}

void cpu_active_union(const Graph& g, const Node& n, const RunShape& shape, int ith, int32_t* mark) {
  if (ith != 0) return;
  int32_t* u = static_cast<int32_t*>(g.tensors[size_t(n.dst)].data);
  const Tensor& lists = src(g, n, ActiveUnionSrc::lists);
  const ActiveUnionParams& p = n.p.active_union;
  const int64_t n_ff = p.n_ff, n_tok = rows_in_run(lists, shape);
  if (n_tok > p.max_tokens) {  // a prefill: dense without looking
    u[0] = -1;
    return;
  }
  int64_t listed = 0;
  for (int64_t t = 0; t < n_tok; ++t) listed += row_ptr<const int32_t>(lists, t)[0];
  // One token: a GEMV reads every row anyway, so the plan's density decides (max_single). Several: the dense
  // GEMM reuses each row for all of them, the per-token axpys do not (bench/results/batch_union.md).
  const double mean = double(listed) / double(n_tok * n_ff);
  if (mean > (n_tok == 1 ? p.max_single : p.max_density)) {  // decided before building the union
    u[0] = -1;
    return;
  }
  for (int64_t j = 0; j < n_ff; ++j) mark[j] = 0;
  for (int64_t t = 0; t < n_tok; ++t) {
    const int32_t* list = row_ptr<const int32_t>(lists, t);
    for (int32_t kk = 0; kk < list[0]; ++kk) mark[list[1 + kk]] = 1;
  }
  int32_t count = 0;
  for (int64_t j = 0; j < n_ff; ++j) {
    u[1 + count] = int32_t(j);
    count += mark[j];
  }
  const bool dense = n_tok > 1 && double(count) > double(p.max_union) * double(n_ff);
  u[0] = dense ? -1 : count;
}

void cpu_gated_act(const Graph& g, const Node& n, const RunShape& shape, int ith, int nth) {
  const Tensor& dst = g.tensors[size_t(n.dst)];
  const Activation act = n.p.gated_act.act;
  const float thr = n.p.gated_act.threshold;
  for (int64_t t = 0; t < rows_in_run(dst, shape); ++t) {
    const float* gate = row_ptr<const float>(src(g, n, GatedActSrc::gate), t);
    const float* up = row_ptr<const float>(src(g, n, GatedActSrc::up), t);
    const int32_t* list = row_ptr<const int32_t>(src(g, n, GatedActSrc::active), t);
    float* y = row_ptr<float>(dst, t);
    int64_t k0, k1;
    thread_share(list[0], ith, nth, 16, k0, k1);
    for (int64_t kk = k0; kk < k1; ++kk) {
      const int32_t j = list[1 + kk];
      const float a = gated_act(act, gate[j], up[j]);
      y[j] = std::fabs(a) > thr ? a : 0.f;
    }
  }
}

namespace {

// Token t's nonzero activations as (down row, coefficient) pairs, ascending rows; returns how many.
int64_t compact_token(const Graph& g, const Node& n, int64_t t, int32_t* ids, float* coef, float* dense) {
  const Tensor& w = src(g, n, DownAxpySrc::down);
  const int rm = n.src[DownAxpySrc::row_map];
  const int32_t* row_map = rm >= 0 ? static_cast<const int32_t*>(g.tensors[size_t(rm)].data) : nullptr;
  const float* act = row_ptr<const float>(src(g, n, DownAxpySrc::act), t);
  const int32_t* list = row_ptr<const int32_t>(src(g, n, DownAxpySrc::active), t);
  int64_t m = 0;
  if (row_map) {  // list ids -> down rows, then ascending rows (Q4T walks 32-neuron groups in order)
    for (int64_t r = 0; r < w.rows; ++r) dense[r] = 0.f;
    for (int32_t kk = 0; kk < list[0]; ++kk) dense[row_map[list[1 + kk]]] = act[list[1 + kk]];
    for (int64_t r = 0; r < w.rows; ++r) {
      ids[m] = int32_t(r);
      coef[m] = dense[r];
      m += dense[r] != 0.f;
    }
  } else {
    for (int32_t kk = 0; kk < list[0]; ++kk) {  // drop neurons the threshold zeroed after the gather
      const int32_t j = list[1 + kk];
      ids[m] = j;
      coef[m] = act[j];
      m += act[j] != 0.f;
    }
  }
  return m;
}

// Bytes of the rows a chunk of tokens reads that one column tile may take, so they stay in L2 while
// every token of the chunk passes over them.
constexpr double kTileBytes = 512.0 * 1024.0;

}  // namespace

void cpu_down_axpy(const KernelTable& k, const Graph& g, const Node& n, const RunShape& shape, int ith, int nth,
                   SparseScratch scratch) {
  const Tensor& dst = g.tensors[size_t(n.dst)];
  const Tensor& w = src(g, n, DownAxpySrc::down);
  // Threads own disjoint column slices of the output, so no two threads ever add into the same float:
  // no race and no reduction pass, and each thread reads one contiguous piece of every active row.
  int64_t c0, c1;
  thread_share(dst.cols, ith, nth, kQuantBlock, c0, c1);
  if (c0 >= c1) return;
  const int u = n.src[DownAxpySrc::union_list];
  const int32_t* shared_union = u >= 0 ? static_cast<const int32_t*>(g.tensors[size_t(u)].data) : nullptr;
  const double bytes_per_col = double(w.row_bytes) / double(w.cols);
  const int64_t n_tok = rows_in_run(dst, shape);
  int64_t m[kAxpyTokens];
  for (int64_t t0 = 0; t0 < n_tok; t0 += kAxpyTokens) {
    const int64_t chunk = std::min(kAxpyTokens, n_tok - t0);
    // Every thread compacts the same lists (microseconds): cheaper than a barrier to share them.
    int64_t rows_read = 0;
    for (int64_t i = 0; i < chunk; ++i) {
      m[i] = compact_token(g, n, t0 + i, scratch.ids + i * scratch.stride, scratch.coef + i * scratch.stride,
                           scratch.dense);
      rows_read += m[i];
      float* y = row_ptr<float>(dst, t0 + i);
      for (int64_t c = c0; c < c1; ++c) y[c] = 0.f;
    }
    if (shared_union && shared_union[0] >= 0) rows_read = shared_union[0];
    rows_read = std::min(rows_read, w.rows);
    int64_t tile = c1 - c0;
    if (chunk > 1 && rows_read > 0) {
      const int64_t fit = int64_t(kTileBytes / (double(rows_read) * bytes_per_col)) / kQuantBlock * kQuantBlock;
      tile = std::max<int64_t>(4 * kQuantBlock, std::min(tile, fit));
    }
    for (int64_t tc = c0; tc < c1; tc += tile) {
      for (int64_t i = 0; i < chunk; ++i) {
        AxpyRowsArgs a{w.type, static_cast<const uint8_t*>(w.data), w.row_stride, scratch.ids + i * scratch.stride,
                       scratch.coef + i * scratch.stride, m[i], tc, std::min(tc + tile, c1),
                       row_ptr<float>(dst, t0 + i)};
        a.w_rows = weight_rows(w);
        if (w.type == DType::Q4T) {
          const Tensor& sc = src(g, n, DownAxpySrc::scales);
          a.scales = static_cast<const uint16_t*>(sc.data);
          a.scales_stride = sc.cols;
        }
        k.axpy_rows(a);
      }
    }
  }
}

}  // namespace pyinfer
