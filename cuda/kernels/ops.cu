// Element-wise and row ops of the CUDA backend; each follows the CPU reference named in ops.cuh.
#include <cuda_fp16.h>

#include "kernels/common.cuh"
#include "kernels/dequant.cuh"
#include "kernels/dot_q8a.cuh"

namespace pyinfer::cuda {
namespace {

constexpr int kThreads = 256;

// One warp per (weight row, tile of up to 8 tokens): lanes stride over the columns, then a warp sum.
constexpr int kTokenTile = 8;
__global__ void matmul_kernel(Rows w, Rows x, Rows y) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t t0 = int64_t(blockIdx.y) * kTokenTile;
  if (r >= w.rows) return;
  const uint8_t* wr = w.data + r * w.stride;
  float acc[kTokenTile] = {};
  const int nt = int(x.rows - t0 < kTokenTile ? x.rows - t0 : kTokenTile);
  for (int64_t c = lane; c < w.cols; c += 32) {
    const float wv = weight_elem(w.type, wr, c);
    for (int t = 0; t < nt; ++t) acc[t] += wv * act_elem(x.type, x.data + (t0 + t) * x.stride, c);
  }
  for (int t = 0; t < nt; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0) at<float>(y, t0 + t)[r] = v;
  }
}

// The same against Q8A activations for the block types (dot_q8a.cuh): one warp per row, lanes over blocks.
template <DType T>
__global__ void matmul_q8a_kernel(Rows w, Rows x, Rows y) {
  const int64_t r = int64_t(blockIdx.x) * kDotWarps + threadIdx.x / 32;
  if (r >= w.rows) return;
  const int64_t t0 = int64_t(blockIdx.y) * kTokenTile;
  warp_row_dot_q8a<T, kTokenTile>(w, r, x, t0, int(x.rows - t0 < kTokenTile ? x.rows - t0 : kTokenTile), y);
}

__global__ void get_rows_kernel(Rows table, const int32_t* ids, Rows y, float scale) {
  const int64_t i = blockIdx.x;
  const uint8_t* src = table.data + int64_t(ids[i]) * table.stride;
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < y.cols; c += int64_t(gridDim.y) * blockDim.x) {
    const float v = weight_elem(table.type, src, c);
    at<float>(y, i)[c] = scale != 0.f ? v * scale : v;
  }
}

// One block per (row, segment).
__global__ void rms_norm_kernel(Rows x, const float* weight, Rows y, float eps, int segment) {
  const int64_t r = blockIdx.x, c0 = int64_t(blockIdx.y) * segment;
  const float* xr = at<float>(x, r) + c0;
  float* yr = at<float>(y, r) + c0;
  __shared__ float partial[kThreads / 32];
  float ss = 0.f;
  for (int c = threadIdx.x; c < segment; c += blockDim.x) ss += xr[c] * xr[c];
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.f;
    v = warp_sum(v);
    if (threadIdx.x == 0) partial[0] = v;
  }
  __syncthreads();
  const float scale = rsqrtf(partial[0] / float(segment) + eps);
  for (int c = threadIdx.x; c < segment; c += blockDim.x) yr[c] = xr[c] * scale * weight[c];
}

// One warp per 32-element block, in the CPU's schemes (csrc/kernels/act_quant.h; `scheme` an ActScheme): 0 own
// (fp32 scale per 32), 1 Q8_0 (the scale in fp16), 2 Q8_1 (scale and scale x sum in fp16), 3 Q8_K (one scale per 256,
// each warp taking the largest |x| of its block's 256 itself).
__global__ void quantize_q8a_kernel(Rows x, Rows y, int64_t blocks_per_row, int scheme) {
  const int64_t b = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (b >= x.rows * blocks_per_row) return;
  const int64_t r = b / blocks_per_row, k = b % blocks_per_row;
  const float* xr = at<float>(x, r);
  const float v = xr[k * 32 + lane];
  const bool per256 = scheme == 3 && blocks_per_row % 8 == 0;
  float amax;
  if (per256) {
    float m = 0.f;
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(xr[(k / 8) * 256 + j * 32 + lane]));
    amax = warp_max(m);
  } else {
    amax = warp_max(fabsf(v));
  }
  const float id = amax > 0.f ? 127.f / amax : 0.f;  // as the CPU: subnormal amax -> zeros
  float d = per256 ? (id > 0.f && isfinite(id) ? 1.f / id : 0.f) : amax / 127.f;
  const int q = per256 && !(d > 0.f) ? 0 : max(-127, min(127, __float2int_rn(v * id)));  // half to even, as the CPU
  uint8_t* blk = y.data + r * y.stride + k * 40;
  blk[8 + lane] = uint8_t(int8_t(q));
  const float sum = warp_sum(float(q));
  if (lane == 0) {
    float s = d * sum;
    if (scheme == 2) s = __half2float(__float2half_rn(s));
    if (scheme == 1 || scheme == 2 || (scheme == 3 && !per256)) d = __half2float(__float2half_rn(d));
    if (scheme == 1 || (scheme == 3 && !per256)) s = d * sum;
    reinterpret_cast<float*>(blk)[0] = d;
    reinterpret_cast<float*>(blk)[1] = s;
  }
}

__global__ void rope_kernel(Rows x, Rows y, const int32_t* positions, const float* factors, RopeParams p) {
  const int64_t t = blockIdx.x;
  const int dims = p.n_rot > 0 ? p.n_rot : p.head_dim;  // partial RoPE: the rest of each head passes through
  const int half = dims / 2;
  const int64_t k = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;  // (head, pair)
  if (dims < p.head_dim && x.data != y.data && k < int64_t(p.heads) * (p.head_dim - dims)) {
    const int64_t j = int64_t(k / (p.head_dim - dims)) * p.head_dim + dims + k % (p.head_dim - dims);
    at<float>(y, t)[j] = at<float>(x, t)[j];
  }
  if (k >= int64_t(p.heads) * half) return;
  const int h = int(k / half), i = int(k % half);
  double theta = double(positions[t]) * pow(double(p.base), -2.0 * i / dims);
  const float fs = p.freq_scale != 0.f ? p.freq_scale : 1.f;
  float mscale = p.attn_factor != 0.f ? p.attn_factor : 1.f;
  if (p.ext_factor != 0.f) {  // YaRN, as the CPU's rope_row
    if (factors) theta /= double(factors[i]);
    const double ramp = 1.0 - fmin(1.0, fmax(0.0, (i - double(p.yarn_low)) / fmax(0.001, double(p.yarn_high - p.yarn_low))));
    const double mix = ramp * p.ext_factor;
    theta = theta * double(fs) * (1.0 - mix) + theta * mix;
    mscale *= 1.f + 0.1f * logf(1.f / fs);
  } else {
    if (p.freq_scale != 0.f) theta *= double(p.freq_scale);
    if (factors) theta /= double(factors[i]);
  }
  const float cs = float(cos(theta)) * mscale, sn = float(sin(theta)) * mscale;
  const bool neox = p.mode == RopeMode::Neox;
  const int64_t o = int64_t(h) * p.head_dim;
  const int64_t a = o + (neox ? i : 2 * i), b = o + (neox ? i + half : 2 * i + 1);
  const float x0 = at<float>(x, t)[a], x1 = at<float>(x, t)[b];
  at<float>(y, t)[a] = x0 * cs - x1 * sn;
  at<float>(y, t)[b] = x0 * sn + x1 * cs;
}

__global__ void kv_store_kernel(Rows x, const int32_t* rows, Rows cache) {
  const int64_t t = blockIdx.x;
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < x.cols; c += int64_t(gridDim.y) * blockDim.x)
    at<__half>(cache, rows[t])[c] = __float2half_rn(at<float>(x, t)[c]);
}

// Element-wise over [rows, cols]: grid.y is the row.
enum class Binary { Add, Gated, BiasRelu, Softcap };
__global__ void binary_kernel(Rows a, Rows b, const float* bias, Rows y, Binary op, Activation act, float scale = 1.f,
                              float post = 1.f) {
  const int64_t r = blockIdx.x;
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < y.cols; c += int64_t(gridDim.y) * blockDim.x) {
    const float x = at<float>(a, r)[c];
    float v;
    switch (op) {
      case Binary::Add: v = __fmul_rn(x + __fmul_rn(scale, at<float>(b, r)[c]), post); break;  // 1s: exact
      case Binary::Softcap: v = __fmul_rn(tanhf(__fmul_rn(x, scale)), post); break;  // scale 1 / cap, post cap
      case Binary::Gated: v = gated(act, x, at<float>(b, r)[c]); break;
      default: v = fmaxf(0.f, x + bias[c]); break;
    }
    at<float>(y, r)[c] = v;
  }
}

__global__ void select_rows_kernel(Rows x, const int32_t* rows, Rows y) {
  const int64_t o = blockIdx.x;
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < y.cols; c += int64_t(gridDim.y) * blockDim.x)
    at<float>(y, o)[c] = at<float>(x, rows[o])[c];
}

__global__ void scatter_cols_kernel(Rows x, const int32_t* perm, Rows y) {
  const int64_t r = blockIdx.x;
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < x.cols; c += int64_t(gridDim.y) * blockDim.x)
    at<float>(y, r)[perm[c]] = at<float>(x, r)[c];
}

__global__ void to_half_kernel(Rows src, bool activation, __half* dst) {
  const int64_t r = blockIdx.x;
  const uint8_t* row = src.data + r * src.stride;
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < src.cols; c += int64_t(gridDim.y) * blockDim.x)
    // saturated, not inf: an activation beyond fp16's range (rare; Gemma's can be large) stays finite
    dst[r * src.cols + c] = __float2half_rn(fminf(fmaxf(activation ? act_elem(src.type, row, c)
                                                                   : weight_elem(src.type, row, c), -65504.f), 65504.f));
}

// Rows on grid.x (up to 2^31 - 1; grid.y stops at 65535), column blocks on grid.y.
dim3 row_grid(int64_t cols, int64_t rows) {
  const int64_t y = (cols + kThreads - 1) / kThreads;
  return dim3(unsigned(rows), unsigned(y < 64 ? y : 64));
}

}  // namespace

void matmul(const Rows& w, const Rows& x, const Rows& y, cudaStream_t s) {
  if (x.rows <= 0) return;
  const unsigned tiles = unsigned((x.rows + kTokenTile - 1) / kTokenTile);
  if (x.type == DType::Q8A && has_block_dot(w.type)) {
    const dim3 grid(unsigned((w.rows + kDotWarps - 1) / kDotWarps), tiles);
#define PYINFER_LAUNCH(T) matmul_q8a_kernel<T><<<grid, kDotWarps * 32, 0, s>>>(w, x, y)
    switch (w.type) { PYINFER_BLOCK_DOT_CASES(PYINFER_LAUNCH) default: break; }
#undef PYINFER_LAUNCH
    return;
  }
  const int warps = kThreads / 32;
  matmul_kernel<<<dim3(unsigned((w.rows + warps - 1) / warps), tiles), kThreads, 0, s>>>(w, x, y);
}

void get_rows(const Rows& table, const int32_t* ids, const Rows& y, float scale, cudaStream_t s) {
  if (y.rows > 0) get_rows_kernel<<<row_grid(y.cols, y.rows), kThreads, 0, s>>>(table, ids, y, scale);
}

void rms_norm(const Rows& x, const float* weight, const Rows& y, float eps, int segment, cudaStream_t s) {
  const int seg = segment > 0 ? segment : int(x.cols);
  if (x.rows > 0) rms_norm_kernel<<<dim3(unsigned(x.rows), unsigned(x.cols / seg)), kThreads, 0, s>>>(x, weight, y, eps, seg);
}

void quantize_q8a(const Rows& x, const Rows& y, int scheme, cudaStream_t s) {
  const int64_t blocks = x.rows * (x.cols / 32), warps = kThreads / 32;
  if (blocks > 0)
    quantize_q8a_kernel<<<unsigned((blocks + warps - 1) / warps), kThreads, 0, s>>>(x, y, x.cols / 32, scheme);
}

void rope(const Rows& x, const Rows& y, const int32_t* positions, const float* factors, const RopeParams& p,
          cudaStream_t s) {
  const int64_t pairs = int64_t(p.heads) * (p.head_dim / 2);
  if (x.rows > 0)
    rope_kernel<<<dim3(unsigned(x.rows), unsigned((pairs + kThreads - 1) / kThreads)), kThreads, 0, s>>>(x, y, positions, factors, p);
}

void kv_store_f16(const Rows& x, const int32_t* rows, const Rows& cache, cudaStream_t s) {
  if (x.rows > 0) kv_store_kernel<<<row_grid(x.cols, x.rows), kThreads, 0, s>>>(x, rows, cache);
}

void add(const Rows& a, const Rows& b, const Rows& y, float scale, float post, cudaStream_t s) {
  if (y.rows > 0)
    binary_kernel<<<row_grid(y.cols, y.rows), kThreads, 0, s>>>(a, b, nullptr, y, Binary::Add, Activation::SiLU,
                                                                 scale == 0.f ? 1.f : scale, post == 0.f ? 1.f : post);
}

void softcap(const Rows& x, const Rows& y, float cap, cudaStream_t s) {
  if (y.rows > 0)
    binary_kernel<<<row_grid(y.cols, y.rows), kThreads, 0, s>>>(x, x, nullptr, y, Binary::Softcap, Activation::SiLU,
                                                                 1.f / cap, cap);
}

void gated_mul(const Rows& gate, const Rows& up, const Rows& y, Activation act, cudaStream_t s) {
  if (y.rows > 0) binary_kernel<<<row_grid(y.cols, y.rows), kThreads, 0, s>>>(gate, up, nullptr, y, Binary::Gated, act);
}

void bias_relu(const Rows& x, const float* bias, const Rows& y, cudaStream_t s) {
  if (y.rows > 0) binary_kernel<<<row_grid(y.cols, y.rows), kThreads, 0, s>>>(x, x, bias, y, Binary::BiasRelu, Activation::SiLU);
}

void select_rows(const Rows& x, const int32_t* rows, const Rows& y, cudaStream_t s) {
  if (y.rows > 0) select_rows_kernel<<<row_grid(y.cols, y.rows), kThreads, 0, s>>>(x, rows, y);
}

void scatter_cols(const Rows& x, const int32_t* perm, const Rows& y, cudaStream_t s) {
  if (y.rows > 0) scatter_cols_kernel<<<row_grid(x.cols, y.rows), kThreads, 0, s>>>(x, perm, y);
}

void to_half(const Rows& src, bool activation, __half* dst, cudaStream_t s) {
  if (src.rows > 0) to_half_kernel<<<row_grid(src.cols, src.rows), kThreads, 0, s>>>(src, activation, dst);
}

}  // namespace pyinfer::cuda
