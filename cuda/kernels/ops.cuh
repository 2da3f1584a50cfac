// Launchers of the CUDA backend's kernels. Each takes device pointers, strides in bytes (rows of views may be
// wider than their elements) and the stream; the CPU reference of each is named beside it.
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "graph/dtype.h"
#include "graph/op_params.h"

namespace pyinfer::cuda {

struct Rows {          // a tensor's rows as the kernels see them
  uint8_t* data;
  int64_t rows;        // rows in this run
  int64_t cols;
  int64_t stride;      // bytes from one row to the next
  DType type;
};

// y[t][r] = sum_c w[r][c] x[t][c] (csrc/kernels/matmul_*.cpp); x is F32 or Q8A.
void matmul(const Rows& w, const Rows& x, const Rows& y, cudaStream_t s);
// y[i] = dequant(table[ids[i]]) * scale (scale 0: unscaled).
void get_rows(const Rows& table, const int32_t* ids, const Rows& y, float scale, cudaStream_t s);
// Per row, or per segment of `segment` columns: x / rms(x) * weight.
void rms_norm(const Rows& x, const float* weight, const Rows& y, float eps, int segment, cudaStream_t s);
// Q8A blocks of an F32 row (quantize_q8a_scalar: d = amax / 127, q = round half to even of x / d).
void quantize_q8a(const Rows& x, const Rows& y, int scheme, cudaStream_t s);  // scheme: an ActScheme
// factors: F32 [head_dim / 2] frequency divisors, or nullptr.
void rope(const Rows& x, const Rows& y, const int32_t* positions, const float* factors, const RopeParams& p,
          cudaStream_t s);
// cache[rows[t]] = fp16(x[t]).
void kv_store_f16(const Rows& x, const int32_t* rows, const Rows& cache, cudaStream_t s);
// (a + scale * b) * post (each 0: 1; ops_float.cpp add_row, scale_row)
void add(const Rows& a, const Rows& b, const Rows& y, float scale, float post, cudaStream_t s);
void softcap(const Rows& x, const Rows& y, float cap, cudaStream_t s);  // cap * tanh(x / cap) (softcap_row)
void gated_mul(const Rows& gate, const Rows& up, const Rows& y, Activation act, cudaStream_t s);
void select_rows(const Rows& x, const int32_t* rows, const Rows& y, cudaStream_t s);
void bias_relu(const Rows& x, const float* bias, const Rows& y, cudaStream_t s);
void scatter_cols(const Rows& x, const int32_t* perm, const Rows& y, cudaStream_t s);
// dst [rows, cols] packed fp16 = src's rows dequantized (a weight's type, or an activation's: F32 or Q8A);
// the inputs of the cuBLAS path (cublas_gemm.h).
void to_half(const Rows& src, bool activation, __half* dst, cudaStream_t s);

struct AttentionRows {
  Rows q, k, v, out;           // q/out F32 [T, heads * head_dim]; k/v F16 caches
  const int32_t* positions;    // [T]
  const int32_t* table;        // paged: [T, table_cols] block ids, or null
  int64_t table_cols;
  const float* sinks = nullptr;  // [heads]: gpt-oss's per-head sink logits, or null
  Rows q_rope{};                 // MLA: F32 [T, heads * r], each query head's last r values (q then holds the
                                 // first head_dim - r of each head); no data: q holds whole heads
};
// Causal attention (csrc/kernels/attention.cpp): one warp per (token, head), online softmax over the keys. Heads
// up to kMaxAttentionDims values (MLA's 512 + 64 latent heads included), value heads of p.v_dim (0: head_dim).
constexpr int kMaxAttentionDims = 640;
void attention(const AttentionRows& a, const AttentionParams& p, cudaStream_t s);

// ---- neuron-aware ops (kernels/sparse.cu; csrc/backends/cpu/sparse_ops.cpp is the reference)
// |act(g)| > t as comparisons (the CPU's GateCut): g > hi, or lo < g < mid.
struct GateThreshold { float hi, lo, mid; };
GateThreshold gate_threshold(GateFn fn, float t);
// Each token's active list: I32 [n_ff + 1], a count then ascending ids.
void active_set(const Rows& scores, const float* cut, const Rows& lists, const ActiveSetParams& p, cudaStream_t s);
// y[t][id] = dot(w[id], x[t]) for the ids of token t's list (`shared`: one list, a batch's union, for all).
void gather_matmul(const Rows& w, const Rows& x, const Rows& y, const Rows& lists, bool shared, cudaStream_t s);
// y[t][j] = act(gate[t][j]) * up[t][j] for the listed j, 0 where its magnitude is at most `threshold`.
void gated_act(const Rows& gate, const Rows& up, const Rows& lists, const Rows& y, Activation act, float threshold,
               cudaStream_t s);
// y[t] = sum over token t's listed j of act[t][j] * down[row_map ? row_map[j] : j] (down neuron-major). A Q4T
// down (nibbles [n_ff, d/2], rows in the original neuron order) takes `q4t_scales`: F16 [n_ff / 32, 2d], each
// 32-neuron group's scale then offset per output column (element = scale * q + offset).
enum class AxpyVariant { Columns, Atomics };
void down_axpy(const Rows& down, const Rows& act, const Rows& lists, const int32_t* row_map, const Rows& y,
               AxpyVariant variant, cudaStream_t s, const __half* q4t_scales = nullptr);

}  // namespace pyinfer::cuda
