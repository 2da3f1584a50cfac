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

}  // namespace pyinfer
