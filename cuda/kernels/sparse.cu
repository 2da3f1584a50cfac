// Neuron-aware ops on the device (csrc/backends/cpu/sparse_ops.cpp is the reference): active lists from a
// predictor or a threshold, gather-GEMV over a list of rows, the gated activation of listed neurons, and the
// down projection as an axpy over active rows, in two variants: each thread owning output columns
// (no atomics, every listed row read by every column block) or blocks of rows adding into the output with
// atomics (PowerInfer's way).
#include "kernels/common.cuh"
#include "kernels/dequant.cuh"
#include "kernels/dot_q8a.cuh"
#include "kernels/ops_float.h"

namespace pyinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTokenTile = 8;

// One block per token: flags in chunks of the block size, an in-order compaction through a block scan.
__global__ void active_set_kernel(Rows scores, const float* cut, Rows lists, ActiveSetParams p, GateThreshold sc) {
  const int64_t t = blockIdx.x;
  const float* s = at<const float>(scores, t);
  int32_t* list = at<int32_t>(lists, t);
  __shared__ int32_t scan[kThreads];
  __shared__ int32_t count;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  const bool predictor = p.mode == ActiveSetMode::Predictor;
  for (int32_t base = 0; base < p.n_ff; base += kThreads) {
    const int32_t j = base + int32_t(threadIdx.x);
    bool on = false;
    if (j < p.n_ff) {
      if (predictor) on = j < p.hot || s[j - p.hot] > cut[j - p.hot];
      else if (p.gate_fn != GateFn::Identity) on = (s[j] > sc.hi) | ((s[j] > sc.lo) & (s[j] < sc.mid));
      else on = fabsf(s[j]) > p.threshold;
    }
    scan[threadIdx.x] = on;
    __syncthreads();
    for (int o = 1; o < kThreads; o <<= 1) {  // inclusive Hillis-Steele scan
      const int32_t v = threadIdx.x >= unsigned(o) ? scan[threadIdx.x - o] : 0;
      __syncthreads();
      scan[threadIdx.x] += v;
      __syncthreads();
    }
    if (on) list[1 + count + scan[threadIdx.x] - 1] = j;
    __syncthreads();
    if (threadIdx.x == kThreads - 1) count += scan[kThreads - 1];
    __syncthreads();
  }
  if (threadIdx.x == 0) list[0] = count;
}

// One warp per (listed row, tile of tokens); a shared list serves every token.
__global__ void gather_matmul_kernel(Rows w, Rows x, Rows y, Rows lists, bool shared) {
  const int64_t k = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t t_list = shared ? 0 : blockIdx.y;
  const int32_t* list = at<const int32_t>(lists, t_list);
  if (k >= list[0]) return;
  const int64_t row = list[1 + k];
  const uint8_t* wr = w.data + row * w.stride;
  const int64_t t0 = shared ? int64_t(blockIdx.y) * kTokenTile : blockIdx.y;
  const int nt = shared ? int(x.rows - t0 < kTokenTile ? x.rows - t0 : kTokenTile) : 1;
  float acc[kTokenTile] = {};
  for (int64_t c = lane; c < w.cols; c += 32) {
    const float wv = weight_elem(w.type, wr, c);
    for (int t = 0; t < nt; ++t) acc[t] += wv * act_elem(x.type, x.data + (t0 + t) * x.stride, c);
  }
  for (int t = 0; t < nt; ++t) {
    float v = acc[t];
    v = warp_sum(v);
    if (lane == 0) at<float>(y, t0 + t)[row] = v;
  }
}

// The same against Q8A activations for the block types (dot_q8a.cuh).
template <DType T>
__global__ void gather_matmul_q8a_kernel(Rows w, Rows x, Rows y, Rows lists, bool shared) {
  const int64_t k = int64_t(blockIdx.x) * kDotWarps + threadIdx.x / 32;
  const int32_t* list = at<const int32_t>(lists, shared ? 0 : blockIdx.y);
  if (k >= list[0]) return;
  const int64_t t0 = shared ? int64_t(blockIdx.y) * kTokenTile : blockIdx.y;
  const int nt = shared ? int(x.rows - t0 < kTokenTile ? x.rows - t0 : kTokenTile) : 1;
  warp_row_dot_q8a<T, kTokenTile>(w, list[1 + k], x, t0, nt, y);
}

__global__ void gated_act_kernel(Rows gate, Rows up, Rows lists, Rows y, Activation act, float threshold) {
  const int64_t t = blockIdx.x;
  const int32_t* list = at<const int32_t>(lists, t);
  for (int32_t k = int32_t(blockIdx.y) * blockDim.x + threadIdx.x; k < list[0]; k += gridDim.y * blockDim.x) {
    const int32_t j = list[1 + k];
    const float a = gated(act, at<const float>(gate, t)[j], at<const float>(up, t)[j]);
    at<float>(y, t)[j] = fabsf(a) > threshold ? a : 0.f;
  }
}

// Element c of down row `row`: any weight type, or Q4T with its group's scale and offset for column c.
__device__ __forceinline__ float down_elem(const Rows& down, const __half* q4t, int64_t row, int64_t c) {
  const uint8_t* r = down.data + row * down.stride;
  if (q4t == nullptr) return weight_elem(down.type, r, c);
  const int j = int(c % 32);
  const uint8_t byte = r[(c / 32) * 16 + (j & 15)];
  const float q = float(j < 16 ? byte & 0x0f : byte >> 4);
  const __half* g = q4t + (row / 32) * 2 * down.cols;
  return __half2float(g[c]) * q + __half2float(g[down.cols + c]);
}

// Columns variant: each thread owns one output column of one token and walks the token's list.
__global__ void axpy_columns_kernel(Rows down, Rows act, Rows lists, const int32_t* row_map, Rows y,
                                    const __half* q4t) {
  const int64_t t = blockIdx.x;
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= down.cols) return;
  const int32_t* list = at<const int32_t>(lists, t);
  const float* a = at<const float>(act, t);
  float acc = 0.f;
  for (int32_t k = 0; k < list[0]; ++k) {
    const int32_t j = list[1 + k];
    const float coef = a[j];
    if (coef == 0.f) continue;  // neurons the threshold zeroed after the gather
    const int64_t row = row_map ? row_map[j] : j;
    acc += coef * down_elem(down, q4t, row, c);
  }
  at<float>(y, t)[c] = acc;
}

// Atomics variant: each block takes kRowsPerBlock listed rows of one token and adds their share into the
// (zeroed) output.
constexpr int kRowsPerBlock = 16;
__global__ void axpy_atomic_kernel(Rows down, Rows act, Rows lists, const int32_t* row_map, Rows y,
                                   const __half* q4t) {
  const int64_t t = blockIdx.y;
  const int32_t* list = at<const int32_t>(lists, t);
  const int32_t k0 = int32_t(blockIdx.x) * kRowsPerBlock;
  if (k0 >= list[0]) return;
  const int32_t k1 = min(list[0], k0 + kRowsPerBlock);
  const float* a = at<const float>(act, t);
  for (int64_t c = threadIdx.x; c < down.cols; c += blockDim.x) {
    float acc = 0.f;
    for (int32_t k = k0; k < k1; ++k) {
      const int32_t j = list[1 + k];
      const int64_t row = row_map ? row_map[j] : j;
      acc += a[j] * down_elem(down, q4t, row, c);
    }
    atomicAdd(at<float>(y, t) + c, acc);
  }
}

__global__ void zero_rows_kernel(Rows y) {
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < y.cols; c += int64_t(gridDim.y) * blockDim.x)
    at<float>(y, blockIdx.x)[c] = 0.f;
}

unsigned col_blocks(int64_t cols) {
  const int64_t b = (cols + kThreads - 1) / kThreads;
  return unsigned(b < 64 ? b : 64);
}

}  // namespace

GateThreshold gate_threshold(GateFn fn, float t) {
  const GateCut cut(fn, t);  // the CPU's cut-offs (kernels/ops_float.h)
  return GateThreshold{cut.hi, cut.lo, cut.mid};
}

void active_set(const Rows& scores, const float* cut, const Rows& lists, const ActiveSetParams& p, cudaStream_t s) {
  if (lists.rows > 0)
    active_set_kernel<<<unsigned(lists.rows), kThreads, 0, s>>>(scores, cut, lists, p, gate_threshold(p.gate_fn, p.threshold));
}

void gather_matmul(const Rows& w, const Rows& x, const Rows& y, const Rows& lists, bool shared, cudaStream_t s) {
  if (y.rows <= 0) return;
  const unsigned tiles = shared ? unsigned((y.rows + kTokenTile - 1) / kTokenTile) : unsigned(y.rows);
  if (x.type == DType::Q8A && has_block_dot(w.type)) {
    const dim3 grid(unsigned((w.rows + kDotWarps - 1) / kDotWarps), tiles);
#define PYINFER_LAUNCH(T) gather_matmul_q8a_kernel<T><<<grid, kDotWarps * 32, 0, s>>>(w, x, y, lists, shared)
    switch (w.type) { PYINFER_BLOCK_DOT_CASES(PYINFER_LAUNCH) default: break; }
#undef PYINFER_LAUNCH
    return;
  }
  const int warps = kThreads / 32;
  gather_matmul_kernel<<<dim3(unsigned((w.rows + warps - 1) / warps), tiles), kThreads, 0, s>>>(w, x, y, lists, shared);
}

void gated_act(const Rows& gate, const Rows& up, const Rows& lists, const Rows& y, Activation act, float threshold,
               cudaStream_t s) {
  if (y.rows > 0)
    gated_act_kernel<<<dim3(unsigned(y.rows), col_blocks(gate.cols)), kThreads, 0, s>>>(gate, up, lists, y, act, threshold);
}

void down_axpy(const Rows& down, const Rows& act, const Rows& lists, const int32_t* row_map, const Rows& y,
               AxpyVariant variant, cudaStream_t s, const __half* q4t_scales) {
  if (y.rows <= 0) return;
  if (variant == AxpyVariant::Columns) {
    axpy_columns_kernel<<<dim3(unsigned(y.rows), unsigned((down.cols + kThreads - 1) / kThreads)), kThreads, 0, s>>>(
        down, act, lists, row_map, y, q4t_scales);
    return;
  }
  zero_rows_kernel<<<dim3(unsigned(y.rows), col_blocks(y.cols)), kThreads, 0, s>>>(y);
  axpy_atomic_kernel<<<dim3(unsigned((down.rows + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(y.rows)), kThreads, 0,
                       s>>>(down, act, lists, row_map, y, q4t_scales);
}

}  // namespace pyinfer::cuda
