// Row-wise float ops shared by every ISA (small next to the matmuls; the compiler vectorises them).
#pragma once
#include <cmath>
#include <cstdint>

#include "graph/dtype.h"
#include "kernels/kernels.h"

namespace pyinfer {

// SiLU, shared by the dense and sparse FFN ops so both paths round alike.
inline float silu(float x) { return x / (1.f + std::exp(-x)); }

void dequantize_row(DType type, const uint8_t* src, float* dst, int64_t n);
void rms_norm_row(const float* x, const float* weight, float* y, int64_t n, float eps);
// Rotates adjacent pairs (GGML's "normal" RoPE, used by the llama architecture).
void rope_row(const float* x, float* y, int32_t pos, int heads, int head_dim, float base);
void add_row(const float* a, const float* b, float* y, int64_t n);
void silu_mul_row(const float* gate, const float* up, float* y, int64_t n);
void relu_mul_row(const float* gate, const float* up, float* y, int64_t n);  // ReGLU (ReLU models)

// One query row of one head against n_kv cached keys/values (fp16, `kv_stride` elements apart).
// scratch: n_kv floats. With `blocks` (a paged block table), token j of the sequence sits in cache row
// blocks[j / block_size] * block_size + j % block_size; without, in row j.
void attention_head(const KernelTable& k, const float* q, const uint16_t* keys, const uint16_t* values,
                    int64_t kv_stride, int64_t n_kv, int head_dim, float scale, float* scratch, float* out,
                    const int32_t* blocks = nullptr, int block_size = 1);

}  // namespace pyinfer
