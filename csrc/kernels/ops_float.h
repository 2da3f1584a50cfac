// Row-wise float ops shared by every ISA (small next to the matmuls; the compiler vectorises them).
#pragma once
#include <cstdint>

#include "graph/dtype.h"
#include "kernels/kernels.h"

namespace pyinfer {

void dequantize_row(DType type, const uint8_t* src, float* dst, int64_t n);
void rms_norm_row(const float* x, const float* weight, float* y, int64_t n, float eps);
// Rotates adjacent pairs (GGML's "normal" RoPE, used by the llama architecture).
void rope_row(const float* x, float* y, int32_t pos, int heads, int head_dim, float base);
void add_row(const float* a, const float* b, float* y, int64_t n);
void silu_mul_row(const float* gate, const float* up, float* y, int64_t n);

// One query row of one head against n_kv cached keys/values (fp16, `kv_stride` elements apart).
// scratch: n_kv floats.
void attention_head(const KernelTable& k, const float* q, const uint16_t* keys, const uint16_t* values,
                    int64_t kv_stride, int64_t n_kv, int head_dim, float scale, float* scratch, float* out);

}  // namespace pyinfer
