// Causal attention over the fp16 KV cache (csrc/kernels/attention.cpp is the reference): one warp per
// (token, head). Keys go by in chunks of 32, one per lane for the scores; the running max and sum of the
// online softmax are kept by every lane, and each lane owns v_dim / 32 output dimensions. Multi-head latent
// attention (DeepSeek-V2) is the same loop: a query head assembled from q and q_rope, the value a prefix of each
// key row (its v cache a view of the k cache), shorter than the key.
#include <cuda_fp16.h>

#include "kernels/ops.cuh"

namespace pyinfer::cuda {
namespace {

constexpr int kMaxDimsPerLane = kMaxAttentionDims / 32;
constexpr int kWarps = 4;

// kVec: key rows 16-byte aligned and head_dim a multiple of 8, so a lane reads its key 8 halves at a time
// (one load of 16 bytes, not 8 of 2: the scores' loop was most of a decode step's attention time on an H200).
template <bool kVec>
__global__ void attention_kernel(AttentionRows a, AttentionParams p) {
  const int64_t t = blockIdx.x;  // tokens on grid.x (grid.y stops at 65535)
  const int h = int(blockIdx.y) * (blockDim.x / 32) + int(threadIdx.x / 32);
  const int lane = threadIdx.x % 32;
  if (h >= p.heads) return;
  const int kvh = h / (p.heads / p.kv_heads);
  const int vd = p.v_dim > 0 ? p.v_dim : p.head_dim;
  const int r = a.q_rope.data ? int(a.q_rope.cols / p.heads) : 0, q_own = p.head_dim - r;  // MLA: q | q_rope
  const float* q = reinterpret_cast<const float*>(a.q.data + t * a.q.stride) + int64_t(h) * q_own;
  const float* qr = r ? reinterpret_cast<const float*>(a.q_rope.data + t * a.q_rope.stride) + int64_t(h) * r : nullptr;
  __shared__ float q_shared[kWarps][32 * kMaxDimsPerLane];  // the warp's query, read by every lane
  float* qw = q_shared[threadIdx.x / 32];
  for (int d = lane; d < p.head_dim; d += 32) qw[d] = d < q_own ? q[d] : qr[d - q_own];
  __syncwarp();
  const int pos = a.positions[t];
  const int lo = p.window > 0 ? max(0, pos - p.window + 1) : 0;
  const int per_lane = (vd + 31) / 32;
  float acc[kMaxDimsPerLane] = {};
  float m = -INFINITY, sum = 0.f;
  for (int k0 = lo; k0 <= pos; k0 += 32) {
    const int key = k0 + lane;
    float score = -INFINITY;
    int64_t row = 0;
    if (key <= pos) {
      row = a.table ? int64_t(a.table[t * a.table_cols + key / p.block_size]) * p.block_size + key % p.block_size : key;
      const __half* k = reinterpret_cast<const __half*>(a.k.data + row * a.k.stride) + int64_t(kvh) * p.head_dim;
      float s = 0.f;
      if (kVec) {
        for (int d8 = 0; d8 < p.head_dim / 8; ++d8) {
          const uint4 u = reinterpret_cast<const uint4*>(k)[d8];
          const __half2* k2 = reinterpret_cast<const __half2*>(&u);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 f = __half22float2(k2[i]);
            s += qw[8 * d8 + 2 * i] * f.x + qw[8 * d8 + 2 * i + 1] * f.y;
          }
        }
      } else {
        for (int d = 0; d < p.head_dim; ++d) s += qw[d] * __half2float(k[d]);
      }
      score = s * p.scale;
    }
    float chunk_max = score;
    for (int o = 16; o > 0; o >>= 1) chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, o));
    const float m_new = fmaxf(m, chunk_max);
    const float rescale = m == -INFINITY ? 0.f : expf(m - m_new);
    sum *= rescale;
    for (int i = 0; i < per_lane; ++i) acc[i] *= rescale;
    const int n = min(32, pos - k0 + 1);
    for (int j = 0; j < n; ++j) {
      const float w = expf(__shfl_sync(0xffffffffu, score, j) - m_new);
      const int64_t kr = __shfl_sync(0xffffffffu, row, j);
      const __half* v = reinterpret_cast<const __half*>(a.v.data + kr * a.v.stride) + int64_t(kvh) * vd;
      sum += w;
      for (int i = 0; i < per_lane; ++i) {
        const int d = lane + 32 * i;
        if (d < vd) acc[i] += w * __half2float(v[d]);
      }
    }
    m = m_new;
  }
  float* out = reinterpret_cast<float*>(a.out.data + t * a.out.stride) + int64_t(h) * vd;
  float ms = 1.f;  // the sink joins the denominator as the CPU's with_sink takes it (attention.cpp)
  if (a.sinks) {
    const float s = a.sinks[h];
    if (s > m) {
      ms = expf(m - s);
      sum = sum * ms + 1.f;
    } else {
      sum += expf(s - m);
    }
  }
  for (int i = 0; i < per_lane; ++i) {
    const int d = lane + 32 * i;
    if (d < vd) out[d] = sum > 0.f ? acc[i] * ms / sum : 0.f;
  }
}

}  // namespace

void attention(const AttentionRows& a, const AttentionParams& p, cudaStream_t s) {
  if (a.q.rows <= 0) return;
  const dim3 grid(unsigned(a.q.rows), unsigned((p.heads + kWarps - 1) / kWarps));
  const bool vec = p.head_dim % 8 == 0 && a.k.stride % 16 == 0 && reinterpret_cast<uintptr_t>(a.k.data) % 16 == 0;
  if (vec) attention_kernel<true><<<grid, 32 * kWarps, 0, s>>>(a, p);
  else attention_kernel<false><<<grid, 32 * kWarps, 0, s>>>(a, p);
}

}  // namespace pyinfer::cuda
