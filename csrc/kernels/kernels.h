// CPU kernel table: one implementation per ISA, chosen at run time by CPU features.
// Kernels are stateless; all memory is passed in.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "graph/dtype.h"

namespace pyinfer {

// dst[t * ldd + r] = dot(weight row r, activation row t) for r in [r0, r1), t in [0, n_tok).
struct MatMulArgs {
  DType wtype;               // Q4_0, Q4_1 or Q8_0 (integer dot) / F32, F16, BF16 (float dot)
  const uint8_t* w;          // weight rows, w_row_bytes apart
  size_t w_row_bytes;
  int64_t k;                 // row length in elements
  int64_t r0, r1;            // weight rows to compute
  const void* x;             // [n_tok, k] Q8A (quantized weights) or F32 (float weights)
  size_t x_row_bytes;
  int64_t n_tok;
  float* dst;
  int64_t ldd;               // floats between dst rows (tokens)
};

struct KernelTable {
  const char* isa;
  void (*matmul)(const MatMulArgs& a);
  // y: n/32 blocks; n % 32 == 0
  void (*quantize_q8a)(const float* x, BlockQ8A* y, int64_t n);
  float (*dot_f16_f32)(const uint16_t* a, const float* b, int64_t n);
  void (*axpy_f16_f32)(float alpha, const uint16_t* x, float* y, int64_t n);  // y += alpha * x
  void (*f32_to_f16)(const float* x, uint16_t* y, int64_t n);
};

// Implementations. The AVX2 table needs AVX2+FMA+F16C; NEON exists only on aarch64 builds.
const KernelTable& kernels_scalar();
const KernelTable* kernels_avx2();     // nullptr when not compiled in
const KernelTable* kernels_neon();     // nullptr when not compiled in

// "auto" picks the best table this CPU supports; a named ISA that the CPU or build lacks throws.
const KernelTable& select_kernels(const std::string& isa);
// Comma-separated ISAs usable on this CPU, best first.
std::string available_isas();

// Shared float-weight matmul (F32/F16/BF16): not on any hot path of the quantized models.
void matmul_float_weights(const MatMulArgs& a);

}  // namespace pyinfer
