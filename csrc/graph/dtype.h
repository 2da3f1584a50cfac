// Element and block types shared by the graph, the kernels and the bindings.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pyinfer {

// Weight types keep GGML's numeric ids so a GGUF tensor type maps 1:1.
enum class DType : int32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q8_0 = 8,
  I32 = 26,
  BF16 = 30,
  // Activations quantized on the fly for integer-dot GEMV/GEMM. Not a GGUF type.
  Q8A = 1000,
  // Neuron-major 4-bit down projection: row j = neuron j's down column as nibbles (GGML order per 32
  // elements, 16 bytes). The Q4_1/Q4_0 scales stay shared by groups of 32 neurons, in a side F16 tensor
  // [n_ff / 32, 2 * d] (scales, then offsets), so the transposition is lossless. Not a GGUF type.
  Q4T = 1001,
};

constexpr int kQuantBlock = 32;  // elements per block, for every quantized type here

// Stored GGUF blocks. fp16 fields are raw bits.
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };           // x = d * (q - 8)
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[16]; };  // x = d * q + m
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };            // x = d * q
// Activation block: fp32 scale and s = d * sum(q), which folds Q4_1's offset and Q4_0's -8 into one FMA.
struct BlockQ8A { float d; float s; int8_t qs[32]; };
static_assert(sizeof(BlockQ4_0) == 18, "GGUF Q4_0 layout");
static_assert(sizeof(BlockQ4_1) == 20, "GGUF Q4_1 layout");
static_assert(sizeof(BlockQ8_0) == 34, "GGUF Q8_0 layout");
static_assert(sizeof(BlockQ8A) == 40, "activation block layout");

bool dtype_is_quantized(DType t);
bool dtype_is_known(DType t);
const char* dtype_name(DType t);
// Bytes of one row of `n` elements; n must be a multiple of 32 for block types.
size_t dtype_row_bytes(DType t, int64_t n);

}  // namespace pyinfer
