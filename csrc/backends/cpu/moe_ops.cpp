#include "backends/cpu/moe_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "backends/cpu/sparse_ops.h"
#include "kernels/moe_route_row.h"
#include "kernels/ops_float.h"

namespace pyinfer {

namespace {

constexpr int32_t kNotHere = -1;  // a split route's slot whose expert another backend computes
constexpr int32_t kBadId = -2;

// Expert `s` of token row `r` of a route (F32 [T, 2k]: weights, then ids as floats): kNotHere for exactly -1,
// kBadId when it is no id of [0, n) (checked as a float first: converting NaN or a huge value to an integer is
// undefined).
inline int32_t route_id(const float* r, int32_t k, int32_t s, int32_t n) {
  const float v = r[k + s];
  if (v == -1.f) return kNotHere;
  return v >= 0.f && v < float(n) ? int32_t(v) : kBadId;
}

}  // namespace

void MoeScratchSize::grow(const Graph& g, const Node& n, int64_t max_tokens) {
  if (n.op != OpKind::MoeMatMul) return;
  const Tensor& w = g.tensors[size_t(n.src[MoeMatMulSrc::weight])];
  const Tensor& x = g.tensors[size_t(n.src[MoeMatMulSrc::x])];
  const int64_t rows_e = w.rows / n.p.moe.n_expert;
  tokens = std::max(tokens, max_tokens);
  order = std::max(order, max_tokens * n.p.moe.k);
  start = std::max(start, int64_t(n.p.moe.n_expert) + 1);
  x_bytes = std::max(x_bytes, max_tokens * int64_t(dtype_row_bytes(x.type, w.cols)));
  out = std::max(out, max_tokens * rows_e);
  if (n.src[MoeMatMulSrc::gate] >= 0) ids = std::max(ids, rows_e);
}

void cpu_moe_route(const Graph& g, const Node& n, const RunShape& shape, int ith, int nth) {
  const Tensor& dst = g.tensors[size_t(n.dst)];
  const Tensor& logits = g.tensors[size_t(n.src[MoeRouteSrc::logits])];
  const MoeRouteParams& P = n.p.moe_route;
  const int b = n.src[MoeRouteSrc::bias];
  const float* bias = b >= 0 ? static_cast<const float*>(g.tensors[size_t(b)].data) : nullptr;
  const int sc = n.src[MoeRouteSrc::expert_scale];
  const float* expert_scale = sc >= 0 ? static_cast<const float*>(g.tensors[size_t(sc)].data) : nullptr;
  int64_t r0, r1;
  thread_share(rows_in_run(dst, shape), ith, nth, 1, r0, r1);
  for (int64_t t = r0; t < r1; ++t)
    moe_route_row(row_ptr<const float>(logits, t), row_ptr<float>(dst, t), P, bias, expert_scale);
}

void cpu_moe_matmul(const KernelTable& kt, const Graph& g, const Node& n, const RunShape& shape, int ith, int nth,
                    MoeScratch scratch) {
  const Tensor& dst = g.tensors[size_t(n.dst)];
  const Tensor& w = g.tensors[size_t(n.src[MoeMatMulSrc::weight])];
  const Tensor& x = g.tensors[size_t(n.src[MoeMatMulSrc::x])];
  const int route_src = n.src[MoeMatMulSrc::route];  // none: slot s runs expert s (a matmul per head)
  const Tensor* route = route_src >= 0 ? &g.tensors[size_t(route_src)] : nullptr;
  const int32_t k = n.p.moe.k, n_expert = n.p.moe.n_expert;
  const int64_t n_tok = rows_in_run(dst, shape);
  const int64_t rows_e = w.rows / n_expert;
  const size_t seg_bytes = dtype_row_bytes(x.type, w.cols);  // one slot's input
  const bool per_slot = x.cols != w.cols;                    // down: slot s reads its own segment
  const size_t expert_bytes = size_t(rows_e) * w.row_stride;
  const auto* w0 = static_cast<const uint8_t*>(w.data);
  // Experts of an expert store (offload/expert_store.h): `data` is a table of n_expert pointers to their rows.
  const auto* const* paged = w.paged ? static_cast<const uint8_t* const*>(w.data) : nullptr;
  auto expert_rows = [&](int32_t e) {
    if (!paged) return w0 + size_t(e) * expert_bytes;
    if (!paged[e]) throw GraphError("expert " + std::to_string(e) + " of '" + w.name + "' was not fetched");
    return paged[e];
  };
  auto x_of = [&](int64_t t, int32_t s) { return row_ptr<const uint8_t>(x, t) + (per_slot ? size_t(s) * seg_bytes : 0); };
  auto expert_of = [&](int64_t t, int32_t s) {  // kNotHere: another backend's expert (its slot stays 0)
    if (!route) return s;
    const int32_t e = route_id(row_ptr<const float>(*route, t), k, s, n_expert);
    if (e == kBadId) throw GraphError("a route names an expert outside [0, " + std::to_string(n_expert) + ")");
    return e;
  };
  const int bias_id = n.src[MoeMatMulSrc::bias];
  const Tensor* bias = bias_id >= 0 ? &g.tensors[size_t(bias_id)] : nullptr;
  auto run_rows = [&](int32_t e, const void* xs, size_t x_stride, int64_t tokens, float* out, int64_t ldd, int64_t r0,
                      int64_t r1) {
    if (e == kNotHere) {  // this thread's rows of the slot are 0, so the combine's sum is this side's share
      std::fill(out + r0, out + r1, 0.f);
      return;
    }
    MatMulArgs a{w.type, expert_rows(e), w.row_stride, w.cols, r0, r1, xs, x_stride, tokens, out, ldd};
    kt.matmul(a);
    if (bias) {  // the expert's own bias (gpt-oss), on the rows this thread computed
      const float* be = row_ptr<const float>(*bias, e);
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t r = r0; r < r1; ++r) out[t * ldd + r] += be[r];
    }
  };
  // CATS inside the experts (one token): only the rows whose gate passes the expert's cut; the others are 0, so
  // act(gate) * up is 0 there and the neuron adds nothing to down.
  const int gate_id = n.src[MoeMatMulSrc::gate];
  const float* gate = gate_id >= 0 && n_tok == 1 ? row_ptr<const float>(g.tensors[size_t(gate_id)], 0) : nullptr;
  auto run_cut_rows = [&](int32_t e, int32_t s, const void* xs, float* out, int64_t r0, int64_t r1) {
    if (e == kNotHere) return std::fill(out + r0, out + r1, 0.f);
    const Tensor& cut_t = g.tensors[size_t(n.src[MoeMatMulSrc::cut])];
    const float* b = row_ptr<const float>(cut_t, e);  // [3]: this expert's bounds
    const GateCut cut(b[0], b[1], b[2]);
    const float* gs = gate + int64_t(s) * rows_e;
    int64_t m = 0;
    for (int64_t r = r0; r < r1; ++r) {  // branch-free: a coin flip near the calibrated density
      scratch.ids[m] = int32_t(r);
      m += cut.above(gs[r]);
      out[r] = 0.f;
    }
    if (m == 0) return;
    MatMulArgs a{w.type, expert_rows(e), w.row_stride, w.cols, 0, m, xs, seg_bytes, 1, out, rows_e, scratch.ids};
    kt.matmul(a);
  };
  if (n_tok == 1) {
    // Decode: the k chosen experts, nothing else. The k slots' rows laid end to end are split into one run per
    // thread, so a thread streams whole experts (k / nth of them) rather than a slice of every one: each slice
    // is a fresh stream the prefetchers must find again (1.25x the bandwidth on 8 experts of 768 x 2048 with
    // 2 threads).
    int64_t a0, a1;
    thread_share(k * rows_e, ith, nth, 16, a0, a1);
    float* out = row_ptr<float>(dst, 0);
    for (int32_t s = int32_t(a0 / rows_e); s < k && int64_t(s) * rows_e < a1; ++s) {
      const int64_t lo = std::max(a0, s * rows_e) - s * rows_e, hi = std::min(a1, (s + 1) * rows_e) - s * rows_e;
      if (gate)
        run_cut_rows(expert_of(0, s), s, x_of(0, s), out + s * rows_e, lo, hi);
      else
        run_rows(expert_of(0, s), x_of(0, s), seg_bytes, 1, out + s * rows_e, rows_e, lo, hi);
    }
    return;
  }
  // Many tokens: (token, slot) pairs grouped by expert (a counting sort, the same on every thread), then each
  // expert's rows run once over its tokens, gathered into consecutive rows (llama.cpp's mul_mat_id), so a weight
  // row is read once per run. The chosen experts' rows laid end to end are split between the threads as in
  // decode, each row weighed by its expert's tokens plus kRowRead for reading it: a thread streams whole experts
  // where it can (a short prefill gives most experts one or two tokens, and reads nearly every expert).
  constexpr int64_t kRowRead = 2;
  int32_t* start = scratch.start;
  std::fill(start, start + n_expert + 1, 0);
  int64_t z0, z1;  // a slot another backend computes: this thread's share of its rows is 0
  thread_share(rows_e, ith, nth, 16, z0, z1);
  for (int64_t t = 0; t < n_tok; ++t)
    for (int32_t s = 0; s < k; ++s) {
      const int32_t e = expert_of(t, s);
      if (e == kNotHere) {
        if (z0 < z1) run_rows(e, nullptr, 0, 1, row_ptr<float>(dst, t) + s * rows_e, rows_e, z0, z1);
        continue;
      }
      ++start[e + 1];
    }
  int64_t total = 0;
  for (int32_t e = 0; e < n_expert; ++e)
    if (start[e + 1]) total += rows_e * (start[e + 1] + kRowRead);
  for (int32_t e = 0; e < n_expert; ++e) start[e + 1] += start[e];
  for (int64_t t = 0; t < n_tok; ++t)  // fill, then shift back: start[e] ends where e + 1 began
    for (int32_t s = 0; s < k; ++s) {
      const int32_t e = expert_of(t, s);
      if (e != kNotHere) scratch.order[start[e]++] = int32_t(t * k + s);
    }
  for (int32_t e = n_expert; e > 0; --e) start[e] = start[e - 1];
  start[0] = 0;
  const int64_t c0 = total * ith / nth, c1 = total * (ith + 1) / nth;  // this thread's share of the weight
  int64_t before = 0;  // the weight of the experts ahead of the current one
  for (int32_t e = 0; e < n_expert; ++e) {
    const int32_t* pairs = scratch.order + start[e];
    const int64_t m = start[e + 1] - start[e];
    if (m == 0) continue;
    // The expert's first row at or after weight c, on a 16-row boundary: the same cut on both of its threads.
    const int64_t per_row = m + kRowRead;
    auto cut = [&](int64_t c) {
      if (c <= before) return int64_t(0);
      const int64_t r = (c - before + per_row - 1) / per_row;
      return std::min(rows_e, (r + 15) / 16 * 16);
    };
    const int64_t r0 = cut(c0), r1 = cut(c1);
    before += rows_e * per_row;
    if (r0 >= r1) continue;
    if (m == 1) {
      const int64_t t = pairs[0] / k;
      const int32_t s = pairs[0] % k;
      run_rows(e, x_of(t, s), seg_bytes, 1, row_ptr<float>(dst, t) + s * rows_e, rows_e, r0, r1);
      continue;
    }
    for (int64_t i0 = 0; i0 < m; i0 += scratch.rows) {  // a token picks an expert once, so one chunk unless
      const int64_t c = std::min(scratch.rows, m - i0);    // a run has more tokens than the scratch was sized for
      for (int64_t i = 0; i < c; ++i)
        std::memcpy(scratch.x + i * seg_bytes, x_of(pairs[i0 + i] / k, pairs[i0 + i] % k), seg_bytes);
      run_rows(e, scratch.x, seg_bytes, c, scratch.out, rows_e, r0, r1);
      for (int64_t i = 0; i < c; ++i) {
        const int32_t pair = pairs[i0 + i];
        std::memcpy(row_ptr<float>(dst, pair / k) + (pair % k) * rows_e + r0, scratch.out + i * rows_e + r0,
                    size_t(r1 - r0) * sizeof(float));
      }
    }
  }
}

void cpu_moe_combine(const Graph& g, const Node& n, const RunShape& shape, int ith, int nth) {
  using S = MoeCombineSrc;
  const Tensor& dst = g.tensors[size_t(n.dst)];
  const Tensor& experts = g.tensors[size_t(n.src[S::experts])];
  const Tensor& route = g.tensors[size_t(n.src[S::route])];
  const Tensor* shared = n.src[S::shared] >= 0 ? &g.tensors[size_t(n.src[S::shared])] : nullptr;
  const Tensor* gate = n.src[S::shared_gate] >= 0 ? &g.tensors[size_t(n.src[S::shared_gate])] : nullptr;
  const int32_t k = n.p.moe.k;
  const int64_t d = dst.cols;
  // Split columns (decode has one token), every thread over every token.
  int64_t c0, c1;
  thread_share(d, ith, nth, 16, c0, c1);
  for (int64_t t = 0, T = rows_in_run(dst, shape); t < T; ++t) {
    const float* w = row_ptr<const float>(route, t);
    const float* e = row_ptr<const float>(experts, t);
    float* y = row_ptr<float>(dst, t);
    for (int64_t c = c0; c < c1; ++c) y[c] = w[0] * e[c];
    for (int32_t s = 1; s < k; ++s)
      for (int64_t c = c0; c < c1; ++c) y[c] += w[s] * e[s * d + c];
    if (shared) {  // Qwen2-MoE: the shared expert, times the sigmoid of its gate
      const float sg = 1.f / (1.f + std::exp(-row_ptr<const float>(*gate, t)[0]));
      const float* sh = row_ptr<const float>(*shared, t);
      for (int64_t c = c0; c < c1; ++c) y[c] += sg * sh[c];
    }
  }
}

void cpu_moe_route_split(const Graph& g, const Node& n, const RunShape& shape, int ith, int nth) {
  using S = MoeRouteSplitSrc;
  const Tensor& dst = g.tensors[size_t(n.dst)];
  const Tensor& route = g.tensors[size_t(n.src[S::route])];
  const Tensor& map_t = g.tensors[size_t(n.src[S::map])];
  const auto* map = static_cast<const int32_t*>(map_t.data);
  const int32_t k = n.p.moe.k, n_local = n.p.moe.n_expert;
  const int32_t n_route = int32_t(map_t.cols);
  int64_t r0, r1;
  thread_share(rows_in_run(dst, shape), ith, nth, 1, r0, r1);
  for (int64_t t = r0; t < r1; ++t) {
    const float* r = row_ptr<const float>(route, t);
    float* out = row_ptr<float>(dst, t);
    for (int32_t s = 0; s < k; ++s) {
      const int32_t e = route_id(r, k, s, n_route);
      if (e == kBadId || e == kNotHere) throw GraphError("a route names an expert outside [0, " + std::to_string(n_route) + ")");
      const int32_t local = map[e];
      if (local < -1 || local >= n_local)
        throw GraphError("the expert map names a local expert outside [0, " + std::to_string(n_local) + ")");
      out[s] = local >= 0 ? r[s] : 0.f;
      out[k + s] = float(local);
    }
  }
}

}  // namespace pyinfer
