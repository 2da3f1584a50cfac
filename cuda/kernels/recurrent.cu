// The recurrent layers' kernels on the device (csrc/kernels/recurrent.cpp is the reference): the causal conv1d with
// its rolling state, one thread per channel, and the gated delta rule, one block per value head and one thread per
// state column. Both take the batch's tokens in order inside the kernel (a sequence's tokens are in order); a token
// at position 0 starts its row from zeros. Row ids were range-checked by the engine before the run.
#include <cuda_runtime.h>

#include "kernels/recurrent.cuh"

namespace pyinfer::cuda {

namespace {

constexpr int kConvThreads = 128;

__device__ __forceinline__ int64_t state_row(const int32_t* rows, int64_t t) { return rows ? rows[t] : 0; }

__global__ void ssm_conv_kernel(Rows x, const float* w, int64_t w_stride, int taps, float* state, int64_t state_stride,
                                const int32_t* positions, const int32_t* rows, Rows y, bool silu) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= y.cols) return;
  const int keep = taps - 1;
  const float* wc = w + c * w_stride;
  for (int64_t t = 0; t < y.rows; ++t) {
    float* sc = state + state_row(rows, t) * state_stride + c * keep;
    if (positions[t] == 0)
      for (int i = 0; i < keep; ++i) sc[i] = 0.f;
    const float xc = reinterpret_cast<const float*>(x.data + t * x.stride)[c];
    float sum = 0.f;
    for (int i = 0; i < keep; ++i) sum += sc[i] * wc[i];
    sum += xc * wc[keep];
    for (int i = 0; i + 1 < keep; ++i) sc[i] = sc[i + 1];
    sc[keep - 1] = xc;
    reinterpret_cast<float*>(y.data + t * y.stride)[c] = silu ? sum / (1.f + expf(-sum)) : sum;
  }
}

// Sum over the block of one value per thread (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < warps; ++i) total += scratch[i];
  return total;
}

// blockIdx.x: the value head; threadIdx.x: the state column j (row j of M, llama.cpp's layout), S threads.
__global__ void delta_net_kernel(Rows qkv, Rows beta, Rows alpha, const float* dt_bias, const float* a, float* state,
                                 int64_t state_stride, const int32_t* positions, const int32_t* rows, Rows out,
                                 DeltaNetParams p) {
  extern __shared__ float shared[];
  const int S = p.head_dim, h = blockIdx.x, j = threadIdx.x;
  float* q = shared;
  float* k = shared + S;
  float* scratch = shared + 2 * S;
  const int kh = p.grouped ? h / (p.v_heads / p.k_heads) : h % p.k_heads;
  const float post = rsqrtf(float(S)), out_scale = rsqrtf(float(S));
  for (int64_t t = 0; t < out.rows; ++t) {
    const float* x = reinterpret_cast<const float*>(qkv.data + t * qkv.stride);
    const float qj = x[int64_t(kh) * S + j], kj = x[int64_t(p.k_heads + kh) * S + j];
    const float qs = block_sum(qj * qj, scratch);
    const float ks = block_sum(kj * kj, scratch);
    q[j] = qj * (1.0f / sqrtf(qs / S + p.eps / S)) * post;  // build_gdn_l2_norm
    k[j] = kj * (1.0f / sqrtf(ks / S + p.eps / S)) * post;
    __syncthreads();
    const float b = 1.0f / (1.0f + expf(-reinterpret_cast<const float*>(beta.data + t * beta.stride)[h]));
    const float z = reinterpret_cast<const float*>(alpha.data + t * alpha.stride)[h] + dt_bias[h];
    const float decay = expf((z > 20.0f ? z : logf(1.0f + expf(z))) * a[h]);
    float* row = state + state_row(rows, t) * state_stride + (int64_t(h) * S + j) * S;
    if (positions[t] == 0)
      for (int i = 0; i < S; ++i) row[i] = 0.f;
    float sk = 0.f;
    for (int i = 0; i < S; ++i) {
      row[i] *= decay;
      sk += row[i] * k[i];
    }
    const float v = x[int64_t(2 * p.k_heads + h) * S + j];
    const float dj = (v - sk) * b;
    float sq = 0.f;
    for (int i = 0; i < S; ++i) {
      row[i] += k[i] * dj;
      sq += row[i] * q[i];
    }
    reinterpret_cast<float*>(out.data + t * out.stride)[int64_t(h) * S + j] = sq * out_scale;
    __syncthreads();  // q and k of the next token overwrite these
  }
}

}  // namespace

void ssm_conv(const Rows& x, const Rows& weight, float* state, int64_t state_stride, const int32_t* positions,
              const int32_t* rows, const Rows& y, bool silu, cudaStream_t s) {
  if (y.rows < 1) return;
  const int blocks = int((y.cols + kConvThreads - 1) / kConvThreads);
  ssm_conv_kernel<<<blocks, kConvThreads, 0, s>>>(x, reinterpret_cast<const float*>(weight.data),
                                                  weight.stride / int64_t(sizeof(float)), int(weight.cols), state,
                                                  state_stride, positions, rows, y, silu);
}

bool delta_net_fits(const DeltaNetParams& p) { return p.head_dim % 32 == 0 && p.head_dim <= 1024; }

void delta_net(const Rows& qkv, const Rows& beta, const Rows& alpha, const float* dt_bias, const float* a, float* state,
               int64_t state_stride, const int32_t* positions, const int32_t* rows, const Rows& out,
               const DeltaNetParams& p, cudaStream_t s) {
  if (out.rows < 1) return;
  const size_t shared = size_t(2 * p.head_dim + 32) * sizeof(float);
  delta_net_kernel<<<p.v_heads, p.head_dim, shared, s>>>(qkv, beta, alpha, dt_bias, a, state, state_stride, positions,
                                                         rows, out, p);
}

}  // namespace pyinfer::cuda
