// Mixture-of-Experts ops on the device (csrc/backends/cpu/moe_ops.cpp is the reference): the router's top k,
// the chosen experts' matmuls (CATS cuts inside them for one token), the weighted combine and a route's split
// between the device's experts and the CPU's. A route is F32 [T, 2k]: k weights, best first, then the k expert
// ids as floats (-1: another backend's expert, whose slot this side leaves 0).
//
// The CPU checks ids and throws; a kernel cannot, so here an id outside [0, n) is treated as another side's
// expert (its slot 0). On the device the route always comes from MoeRoute or MoeRouteSplit run here, whose ids
// are in range by construction, and the graph refuses any other writer of a route (graph.cpp).
#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/dequant.cuh"
#include "kernels/dot_q8a.cuh"
#include "kernels/moe.cuh"
#include "kernels/moe_route_row.h"

namespace pyinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxGridY = 65535;

// Expert id of slot s of a route row, or -1 for another side's expert or an id outside [0, n).
__device__ __forceinline__ int32_t route_expert(const float* r, int32_t k, int32_t s, int32_t n) {
  const float v = r[k + s];
  return v >= 0.f && v < float(n) ? int32_t(v) : -1;
}

// One thread per token (kernels/moe_route_row.h, the CPU's own code).
__global__ void moe_route_kernel(Rows logits, Rows route, MoeRouteParams p, const float* bias, const float* expert_scale) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < route.rows) moe_route_row(at<const float>(logits, t), at<float>(route, t), p, bias, expert_scale);
}

// Where a warp of the expert matmul works: expert row `r` of slot s of token t, and whether it computes it.
// Expert of (token, slot) pair `pair`: the route's, or slot s's own expert s without a route.
__device__ __forceinline__ int32_t pair_expert(const MoeMatMulArgs& a, int64_t pair) {
  const int32_t s = int32_t(pair % a.p.k);
  return a.route.data ? route_expert(at<const float>(a.route, pair / a.p.k), a.p.k, s, a.p.n_expert) : s;
}

// The expert's bias at row r (0 without biases), as the CPU adds it after the row's dot.
__device__ __forceinline__ float expert_bias(const MoeMatMulArgs& a, int32_t e, int64_t r) {
  return a.bias.data ? at<const float>(a.bias, e)[r] : 0.f;
}

struct ExpertRow {
  Rows w;      // the chosen expert's rows [rows_e, cols]
  Rows x;      // token t's input (its slot's segment for down), one row
  Rows y;      // token t's slot s outputs [rows_e], one row
  bool skip;   // another side's expert, or a row its gate's cut leaves out: write 0
  float bias;  // the expert's bias at this row (0 without)
};

__device__ __forceinline__ ExpertRow expert_row(const MoeMatMulArgs& a, int64_t pair, int64_t r) {
  const int32_t k = a.p.k;
  const int64_t t = pair / k;
  const int32_t s = int32_t(pair % k);
  const int64_t rows_e = a.w.rows / a.p.n_expert;
  const int32_t e = pair_expert(a, pair);
  ExpertRow out;
  out.w = Rows{a.w.data + (e < 0 ? 0 : e) * rows_e * a.w.stride, rows_e, a.w.cols, a.w.stride, a.w.type};
  out.x = Rows{a.x.data + t * a.x.stride + (a.per_slot ? s * a.seg_bytes : 0), 1, a.w.cols, a.x.stride, a.x.type};
  out.y = Rows{a.y.data + t * a.y.stride + s * rows_e * int64_t(sizeof(float)), 1, rows_e, a.y.stride, DType::F32};
  out.skip = e < 0;
  out.bias = out.skip ? 0.f : expert_bias(a, e, r);
  if (!out.skip && a.gate != nullptr) {  // one token: CATS, the expert's bounds (hi, lo, mid)
    const float* b = a.cut + 3 * e;
    const float g = a.gate[s * rows_e + r];
    out.skip = !((g > b[0]) | ((g > b[1]) & (g < b[2])));
  }
  return out;
}

// One token (decode): one warp per (expert row, slot); x of any activation type, the weight's elements one by one.
__global__ void moe_matmul_kernel(MoeMatMulArgs a) {
  const int64_t rows_e = a.w.rows / a.p.n_expert;
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows_e) return;
  for (int64_t pair = blockIdx.y; pair < a.pairs; pair += gridDim.y) {
    const ExpertRow er = expert_row(a, pair, r);
    if (er.skip) {
      if (lane == 0) at<float>(er.y, 0)[r] = 0.f;
      continue;
    }
    const uint8_t* wr = er.w.data + r * er.w.stride;
    float acc = 0.f;
    for (int64_t c = lane; c < er.w.cols; c += 32) acc += weight_elem(er.w.type, wr, c) * act_elem(er.x.type, er.x.data, c);
    acc = warp_sum(acc);
    if (lane == 0) at<float>(er.y, 0)[r] = acc + er.bias;
  }
}

// The same against Q8A activations for the block types: the dense matmul's warp dot on the expert's rows.
template <DType T>
__global__ void moe_matmul_q8a_kernel(MoeMatMulArgs a) {
  const int64_t rows_e = a.w.rows / a.p.n_expert;
  const int64_t r = int64_t(blockIdx.x) * kDotWarps + threadIdx.x / 32;
  if (r >= rows_e) return;
  for (int64_t pair = blockIdx.y; pair < a.pairs; pair += gridDim.y) {
    const ExpertRow er = expert_row(a, pair, r);
    if (er.skip) {
      if (threadIdx.x % 32 == 0) at<float>(er.y, 0)[r] = 0.f;
      continue;
    }
    warp_row_dot_q8a<T, 1>(er.w, r, er.x, 0, 1, er.y);
    if (threadIdx.x % 32 == 0 && a.bias.data) at<float>(er.y, 0)[r] += er.bias;  // the lane that stored the dot
  }
}

// Several tokens (prefill, batched decode): grouped by expert, as llama.cpp's mul_mat_id. Block (row group,
// expert e) gathers the (token, slot) pairs routed to e into shared memory, kScan pairs at a time, then each warp
// takes its row of e through every gathered pair, so an expert's row comes from device memory once per run (from
// L1 after the first pair) instead of once per pair: with 128 experts of 2.6 MB a layer's experts are far larger
// than L2, and pair order revisits them at random. Blocks of experts no token chose only scan.
constexpr int kScan = 1024;

__device__ __forceinline__ int32_t gather_pairs(const MoeMatMulArgs& a, int32_t e, int64_t base, int32_t* list,
                                                int32_t* count) {
  __syncthreads();  // the previous pass's list is read by every warp before it is refilled
  if (threadIdx.x == 0) *count = 0;
  __syncthreads();
  const int64_t end = base + kScan < a.pairs ? base + kScan : a.pairs;
  for (int64_t p = base + threadIdx.x; p < end; p += blockDim.x)
    if (pair_expert(a, p) == e) list[atomicAdd(count, 1)] = int32_t(p);
  __syncthreads();
  return *count;
}

__global__ void moe_matmul_grouped_kernel(MoeMatMulArgs a) {
  __shared__ int32_t list[kScan];
  __shared__ int32_t count;
  const int32_t e = int32_t(blockIdx.y);
  const int64_t rows_e = a.w.rows / a.p.n_expert;
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t base = 0; base < a.pairs; base += kScan) {
    const int32_t n = gather_pairs(a, e, base, list, &count);
    if (r >= rows_e) continue;  // no return: every thread meets the next pass's barriers
    for (int32_t i = 0; i < n; ++i) {
      const ExpertRow er = expert_row(a, list[i], r);
      const uint8_t* wr = er.w.data + r * er.w.stride;
      float acc = 0.f;
      for (int64_t c = lane; c < er.w.cols; c += 32)
        acc += weight_elem(er.w.type, wr, c) * act_elem(er.x.type, er.x.data, c);
      acc = warp_sum(acc);
      if (lane == 0) at<float>(er.y, 0)[r] = acc + er.bias;
    }
  }
}

template <DType T>
__global__ void moe_matmul_grouped_q8a_kernel(MoeMatMulArgs a) {
  __shared__ int32_t list[kScan];
  __shared__ int32_t count;
  const int32_t e = int32_t(blockIdx.y);
  const int64_t rows_e = a.w.rows / a.p.n_expert;
  const int64_t r = int64_t(blockIdx.x) * kDotWarps + threadIdx.x / 32;
  for (int64_t base = 0; base < a.pairs; base += kScan) {
    const int32_t n = gather_pairs(a, e, base, list, &count);
    if (r >= rows_e) continue;
    for (int32_t i = 0; i < n; ++i) {
      const ExpertRow er = expert_row(a, list[i], r);
      warp_row_dot_q8a<T, 1>(er.w, r, er.x, 0, 1, er.y);
      if (threadIdx.x % 32 == 0 && a.bias.data) at<float>(er.y, 0)[r] += er.bias;
    }
  }
}

// A slot whose expert is another side's (id -1) is in no expert's group: its rows are zeroed here.
__global__ void moe_zero_other_slots_kernel(MoeMatMulArgs a) {
  const int64_t rows_e = a.w.rows / a.p.n_expert;
  for (int64_t pair = blockIdx.x; pair < a.pairs; pair += gridDim.x) {
    const int64_t t = pair / a.p.k;
    const int32_t s = int32_t(pair % a.p.k);
    if (pair_expert(a, pair) >= 0) continue;
    float* y = at<float>(a.y, t) + s * rows_e;
    for (int64_t r = threadIdx.x; r < rows_e; r += blockDim.x) y[r] = 0.f;
  }
}

// One block per token (its columns over the threads): y = sum_s w[s] * experts[slot s] (+ sigmoid(gate) * shared),
// in the CPU's order of additions.
__global__ void moe_combine_kernel(Rows experts, Rows route, Rows shared, Rows shared_gate, Rows y, int32_t k) {
  const int64_t t = blockIdx.x;
  const float* w = at<const float>(route, t);
  const float* e = at<const float>(experts, t);
  float* out = at<float>(y, t);
  const float sg = shared.data ? 1.f / (1.f + expf(-at<const float>(shared_gate, t)[0])) : 0.f;
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < y.cols; c += int64_t(gridDim.y) * blockDim.x) {
    float v = w[0] * e[c];
    for (int32_t s = 1; s < k; ++s) v += w[s] * e[s * y.cols + c];
    if (shared.data) v += sg * at<const float>(shared, t)[c];
    out[c] = v;
  }
}

// One thread per token: slot s keeps its weight and becomes this side's local id, or weight 0 and -1.
__global__ void moe_route_split_kernel(Rows route, const int32_t* map, int32_t n_route, int32_t n_local, Rows out,
                                       int32_t k) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= out.rows) return;
  const float* r = at<const float>(route, t);
  float* o = at<float>(out, t);
  for (int32_t s = 0; s < k; ++s) {
    const int32_t e = route_expert(r, k, s, n_route);
    int32_t local = e >= 0 ? map[e] : -1;
    if (local < -1 || local >= n_local) local = -1;
    o[s] = local >= 0 ? r[s] : 0.f;
    o[k + s] = float(local);
  }
}

unsigned col_blocks(int64_t cols) {
  const int64_t b = (cols + kThreads - 1) / kThreads;
  return unsigned(b < 64 ? b : 64);
}

}  // namespace

void moe_route(const Rows& logits, const Rows& route, const MoeRouteParams& p, const float* bias,
               const float* expert_scale, cudaStream_t s) {
  if (route.rows > 0)
    moe_route_kernel<<<unsigned((route.rows + 127) / 128), 128, 0, s>>>(logits, route, p, bias, expert_scale);
}

void moe_matmul(MoeMatMulArgs a, cudaStream_t s) {
  a.pairs = a.y.rows * a.p.k;
  if (a.pairs <= 0) return;
  const int64_t rows_e = a.w.rows / a.p.n_expert;
  const bool dots = a.x.type == DType::Q8A && has_block_dot(a.w.type);
  if (a.y.rows != 1) {  // grouped by expert; cuts apply to one-token runs only, as on the CPU
    a.gate = nullptr, a.cut = nullptr;
    moe_zero_other_slots_kernel<<<unsigned(a.pairs < 4096 ? a.pairs : 4096), 128, 0, s>>>(a);
    const unsigned experts = unsigned(a.p.n_expert);  // well under the grid's 65,535
    if (dots) {
      const dim3 grid(unsigned((rows_e + kDotWarps - 1) / kDotWarps), experts);
#define PYINFER_LAUNCH(T) moe_matmul_grouped_q8a_kernel<T><<<grid, kDotWarps * 32, 0, s>>>(a)
      switch (a.w.type) { PYINFER_BLOCK_DOT_CASES(PYINFER_LAUNCH) default: break; }
#undef PYINFER_LAUNCH
      return;
    }
    const int warps = kThreads / 32;
    moe_matmul_grouped_kernel<<<dim3(unsigned((rows_e + warps - 1) / warps), experts), kThreads, 0, s>>>(a);
    return;
  }
  // One token: its k pairs, one expert each (nothing to group).
  const unsigned pairs = unsigned(a.pairs < kMaxGridY ? a.pairs : kMaxGridY);
  if (dots) {
    const dim3 grid(unsigned((rows_e + kDotWarps - 1) / kDotWarps), pairs);
#define PYINFER_LAUNCH(T) moe_matmul_q8a_kernel<T><<<grid, kDotWarps * 32, 0, s>>>(a)
    switch (a.w.type) { PYINFER_BLOCK_DOT_CASES(PYINFER_LAUNCH) default: break; }
#undef PYINFER_LAUNCH
    return;
  }
  const int warps = kThreads / 32;
  moe_matmul_kernel<<<dim3(unsigned((rows_e + warps - 1) / warps), pairs), kThreads, 0, s>>>(a);
}

void moe_combine(const Rows& experts, const Rows& route, const Rows* shared, const Rows* shared_gate, const Rows& y,
                 int32_t k, cudaStream_t s) {
  if (y.rows <= 0) return;
  const Rows none{nullptr, 0, 0, 0, DType::F32};
  moe_combine_kernel<<<dim3(unsigned(y.rows), col_blocks(y.cols)), kThreads, 0, s>>>(
      experts, route, shared ? *shared : none, shared_gate ? *shared_gate : none, y, k);
}

void moe_route_split(const Rows& route, const int32_t* map, int32_t n_route, int32_t n_local, const Rows& out,
                     int32_t k, cudaStream_t s) {
  if (out.rows > 0)
    moe_route_split_kernel<<<unsigned((out.rows + 127) / 128), 128, 0, s>>>(route, map, n_route, n_local, out, k);
}

}  // namespace pyinfer::cuda
