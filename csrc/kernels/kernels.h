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
  DType wtype;               // dtype_is_integer_dot (Q4_0 .. Q6_K) / F32, F16, BF16 (float dot)
  const uint8_t* w;          // weight rows, w_row_bytes apart
  size_t w_row_bytes;
  int64_t k;                 // row length in elements
  int64_t r0, r1;            // weight rows to compute
  const void* x;             // [n_tok, k] Q8A (quantized weights) or F32 (float weights)
  size_t x_row_bytes;
  int64_t n_tok;
  float* dst;
  int64_t ldd;               // floats between dst rows (tokens)
  // Gather-GEMV: when set, computes rows row_ids[r] for r in [r0, r1) and writes dst[t * ldd + row_ids[r]].
  const int32_t* row_ids = nullptr;
  // Paged weights (offload/neuron_store.h): row r lies at w_rows[r] instead of w + r * w_row_bytes.
  const uint8_t* const* w_rows = nullptr;
  const uint8_t* row(int64_t r) const { return w_rows ? w_rows[r] : w + r * int64_t(w_row_bytes); }
};

// y[c0, c1) += sum_k coef[k] * W[ids[k]][c0, c1): the down projection over active neurons only, from a
// neuron-major (transposed) copy of down. c0 and c1 are multiples of 32.
struct AxpyRowsArgs {
  DType wtype;               // Q4T, Q4_1, Q8_0, F32 or F16
  const uint8_t* w;          // [n_ff, d] rows, w_row_bytes apart
  size_t w_row_bytes;
  const int32_t* ids;        // [n] neuron ids
  const float* coef;         // [n] their activations (zeros already dropped)
  int64_t n;
  int64_t c0, c1;
  float* y;                  // [d], accumulated into
  // Q4T: ids ascending; scales of neuron group g at scales + g * scales_stride (d scales, then d offsets).
  const uint16_t* scales = nullptr;
  int64_t scales_stride = 0;
  // Paged weights (offload/neuron_store.h): row j lies at w_rows[j] instead of w + j * w_row_bytes.
  const uint8_t* const* w_rows = nullptr;
  const uint8_t* row(int64_t j) const { return w_rows ? w_rows[j] : w + j * int64_t(w_row_bytes); }
};

struct AttnTileArgs;  // attention.h

struct KernelTable {
  const char* isa;
  void (*matmul)(const MatMulArgs& a);
  // y: n/32 blocks; n % 32 == 0
  void (*quantize_q8a)(const float* x, BlockQ8A* y, int64_t n);
  // The same blocks with one scale per 256 (llama.cpp's Q8_K: kernels/act_quant.h); n % 256 == 0
  void (*quantize_q8k)(const float* x, BlockQ8A* y, int64_t n);
  float (*dot_f16_f32)(const uint16_t* a, const float* b, int64_t n);
  void (*axpy_f16_f32)(float alpha, const uint16_t* x, float* y, int64_t n);  // y += alpha * x
  void (*f32_to_f16)(const float* x, uint16_t* y, int64_t n);
  void (*axpy_rows)(const AxpyRowsArgs& a);
  // Tiled attention (attention.h): one key tile against a block of query rows, and cache rows as floats.
  void (*attn_tile)(const AttnTileArgs& a);
  // `rows` cache rows of n values, `stride` bytes apart from src, to dst rows n floats apart (one call per run
  // of consecutive cache rows: decode converts a whole key tile per call, not a key per call).
  void (*kv_to_f32)(DType type, const uint8_t* src, size_t stride, float* dst, int64_t rows, int64_t n);
  // y = GELU(gate) * up through the fp16 table of gelu_fp16_table() (ops_float.h), the same values as the
  // portable gelu_tanh(); SIMD converts to fp16 and gathers 8 at a time.
  void (*gelu_mul)(const float* gate, const float* up, float* y, int64_t n);
  // y = SiLU(gate) * up through silu_exp's polynomial (ops_float.h): every table gives the same bits, SIMD ones 8
  // (or 4) lanes at a time; libm's expf in a scalar loop was about 5% of a 1.5B model's prefill.
  void (*silu_mul)(const float* gate, const float* up, float* y, int64_t n);
};

// Implementations. The AVX2 table needs AVX2+FMA+F16C; NEON exists only on aarch64 builds.
const KernelTable& kernels_scalar();
const KernelTable* kernels_avx2();     // nullptr when not compiled in
const KernelTable* kernels_avx512();   // AVX2 table + AVX-512VL/VNNI matmul; nullptr when not compiled in
const KernelTable* kernels_neon();     // nullptr when not compiled in
const KernelTable* kernels_amx();      // AVX-512 table + AMX int8 tiles for many-token matmuls; nullptr when not compiled in

// "auto" picks the best table this CPU supports, or the one PYINFER_ISA names when it is set (so AMX can be
// turned off without touching code); a named ISA that the CPU or build lacks throws.
const KernelTable& select_kernels(const std::string& isa);
// Comma-separated ISAs usable on this CPU, best first.
std::string available_isas();

// The portable integer-dot matmul (every quantized type): the reference, and what NEON uses for the
// types it has no kernel of its own for.
void matmul_scalar(const MatMulArgs& a);

// Shared float-weight matmul (F32/F16/BF16): not on any hot path of the quantized models.
void matmul_float_weights(const MatMulArgs& a);

// Per-ISA sparse FFN entry points (sparse_ffn_*.cpp), gathered into the tables above.
void axpy_rows_scalar(const AxpyRowsArgs& a);  // every type; the reference
void axpy_rows_avx2(const AxpyRowsArgs& a);
void axpy_rows_neon(const AxpyRowsArgs& a);

}  // namespace pyinfer
