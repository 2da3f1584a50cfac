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
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I32 = 26,
  BF16 = 30,
  MXFP4 = 39,
  // Activations quantized on the fly for integer-dot GEMV/GEMM. Not a GGUF type.
  Q8A = 1000,
  // Neuron-major 4-bit down projection: row j = neuron j's down column as nibbles (GGML order per 32
  // elements, 16 bytes). The Q4_1/Q4_0 scales stay shared by groups of 32 neurons, in a side F16 tensor
  // [n_ff / 32, 2 * d] (scales, then offsets), so the transposition is lossless. Not a GGUF type.
  Q4T = 1001,
};

constexpr int kQuantBlock = 32;  // elements per block of the legacy types and of activations (Q8A)
constexpr int kSuperBlock = 256; // elements per K-quant super-block (8 sub-blocks of 32)

// Stored GGUF blocks. fp16 fields are raw bits.
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };           // x = d * (q - 8)
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[16]; };  // x = d * q + m
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };            // x = d * q
// 5-bit types: low nibbles as in Q4_0, the fifth bit of element j in bit j of qh.
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };             // x = d * (q - 16)
struct BlockQ5_1 { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[16]; }; // x = d * q + m
// K-quants: 256 elements, 8 sub-blocks of 32 with 6-bit scale and min packed in 12 bytes. Sub-block j
// (0..7) is x = d * sc[j] * q - dmin * mn[j]; its nibbles are qs[32 * (j / 2) ..] (low for even j).
struct BlockQ4_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qs[128]; };
// Q5_K adds the fifth bit of element l of sub-block j as bit j of qh[l].
struct BlockQ5_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
// Q6_K: 16 sub-blocks of 16 with int8 scales; x = d * sc * (q - 32), q = 4 low bits in ql, 2 high in qh.
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
// Q2_K: 16 sub-blocks of 16, scales[i] = 4-bit scale | 4-bit min << 4; x = d * sc * q - dmin * mn, q 2 bits.
struct BlockQ2_K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d; uint16_t dmin; };
// Q3_K: 16 sub-blocks of 16 with 6-bit scales (minus 32) packed in 12 bytes; x = d * sc * (q - 4 * !hmask bit).
struct BlockQ3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
// The non-linear 4-bit types: nibbles index a 16-entry int8 table (kIq4Values, iq_tables.h).
struct BlockIQ4_NL { uint16_t d; uint8_t qs[16]; };
// IQ4_XS: 8 sub-blocks of 32 with 6-bit scales (minus 32): 4 low bits in scales_l, 2 high in scales_h.
struct BlockIQ4_XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; };
// MXFP4: an E8M0 exponent and 32 E2M1 nibbles (kMxfp4Values, doubled, so the exponent is taken as half).
struct BlockMXFP4 { uint8_t e; uint8_t qs[16]; };
// The grid types (iq_tables.h): groups of 8 (IQ2) or 4 (IQ3) magnitudes from a table, signs from 7-bit indices
// with an implied parity bit (or stored bytes for IQ2_S / IQ3_S), a 4-bit scale per 32 or 16 elements.
struct BlockIQ2_XXS { uint16_t d; uint16_t qs[32]; };
struct BlockIQ2_XS { uint16_t d; uint16_t qs[32]; uint8_t scales[8]; };
struct BlockIQ2_S { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t scales[8]; };
struct BlockIQ3_XXS { uint16_t d; uint8_t qs[96]; };
struct BlockIQ3_S { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t signs[32]; uint8_t scales[4]; };
// Activation block: fp32 scale and s = d * sum(q), which folds Q4_1's offset and Q4_0's -8 into one FMA.
struct BlockQ8A { float d; float s; int8_t qs[32]; };
static_assert(sizeof(BlockQ4_0) == 18, "GGUF Q4_0 layout");
static_assert(sizeof(BlockQ4_1) == 20, "GGUF Q4_1 layout");
static_assert(sizeof(BlockQ8_0) == 34, "GGUF Q8_0 layout");
static_assert(sizeof(BlockQ8A) == 40, "activation block layout");
static_assert(sizeof(BlockQ5_0) == 22, "GGUF Q5_0 layout");
static_assert(sizeof(BlockQ5_1) == 24, "GGUF Q5_1 layout");
static_assert(sizeof(BlockQ4_K) == 144, "GGUF Q4_K layout");
static_assert(sizeof(BlockQ5_K) == 176, "GGUF Q5_K layout");
static_assert(sizeof(BlockQ6_K) == 210, "GGUF Q6_K layout");
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockIQ4_NL) == 18 &&
              sizeof(BlockIQ4_XS) == 136 && sizeof(BlockMXFP4) == 17 && sizeof(BlockIQ2_XXS) == 66 &&
              sizeof(BlockIQ2_XS) == 74 && sizeof(BlockIQ2_S) == 82 && sizeof(BlockIQ3_XXS) == 98 &&
              sizeof(BlockIQ3_S) == 110, "GGUF low-bit layouts");

// One row per type: every fact the graph, the kernels (CPU and CUDA), the bindings and the checks need about
// a type, in one place (ggml's type_traits). Adding a type is one row here; the count check below fails until
// every switch over the types has been revisited.
// How activations are quantized for a weight type's integer dot: as llama.cpp quantizes them for it (its
// vec_dot_type), so that a quantized file gives llama.cpp's logits and not only its quality. Q8_0: blocks of 32,
// the scale rounded to fp16; Q8_1: also the block's sum times the scale, rounded to fp16 (Q4_1 / Q5_1's offsets);
// Q8_K: one fp32 scale per 256 (K-quants and the IQ grids). Own: blocks of 32 with fp32 scales (pyinfer's
// internal copy Q4T, whose dots llama.cpp does not have). All are stored as Q8A blocks.
enum class ActScheme : int32_t { Own = 0, Q8_0 = 1, Q8_1 = 2, Q8_K = 3 };

struct DTypeTraits {
  DType type;
  const char* name;
  int32_t block_elems;  // elements per block (1 for element types)
  int32_t block_bytes;  // bytes per block (element size for element types)
  bool integer_dot;     // weights that the integer-dot matmul runs against Q8A activations
  bool quantized;       // stored in blocks with scales (weights, Q8A, Q4T)
  ActScheme act = ActScheme::Own;  // integer-dot weights: how their activations are quantized
};
inline constexpr DTypeTraits kDTypeTraits[] = {
    {DType::F32, "F32", 1, 4, false, false},
    {DType::F16, "F16", 1, 2, false, false},
    {DType::BF16, "BF16", 1, 2, false, false},
    {DType::I32, "I32", 1, 4, false, false},
    {DType::Q4_0, "Q4_0", kQuantBlock, int32_t(sizeof(BlockQ4_0)), true, true, ActScheme::Q8_0},
    {DType::Q4_1, "Q4_1", kQuantBlock, int32_t(sizeof(BlockQ4_1)), true, true, ActScheme::Q8_1},
    {DType::Q5_0, "Q5_0", kQuantBlock, int32_t(sizeof(BlockQ5_0)), true, true, ActScheme::Q8_0},
    {DType::Q5_1, "Q5_1", kQuantBlock, int32_t(sizeof(BlockQ5_1)), true, true, ActScheme::Q8_1},
    {DType::Q8_0, "Q8_0", kQuantBlock, int32_t(sizeof(BlockQ8_0)), true, true, ActScheme::Q8_0},
    {DType::Q4_K, "Q4_K", kSuperBlock, int32_t(sizeof(BlockQ4_K)), true, true, ActScheme::Q8_K},
    {DType::Q5_K, "Q5_K", kSuperBlock, int32_t(sizeof(BlockQ5_K)), true, true, ActScheme::Q8_K},
    {DType::Q6_K, "Q6_K", kSuperBlock, int32_t(sizeof(BlockQ6_K)), true, true, ActScheme::Q8_K},
    {DType::Q2_K, "Q2_K", kSuperBlock, int32_t(sizeof(BlockQ2_K)), true, true, ActScheme::Q8_K},
    {DType::Q3_K, "Q3_K", kSuperBlock, int32_t(sizeof(BlockQ3_K)), true, true, ActScheme::Q8_K},
    {DType::IQ4_NL, "IQ4_NL", kQuantBlock, int32_t(sizeof(BlockIQ4_NL)), true, true, ActScheme::Q8_0},
    {DType::IQ4_XS, "IQ4_XS", kSuperBlock, int32_t(sizeof(BlockIQ4_XS)), true, true, ActScheme::Q8_K},
    {DType::MXFP4, "MXFP4", kQuantBlock, int32_t(sizeof(BlockMXFP4)), true, true, ActScheme::Q8_0},
    {DType::IQ2_XXS, "IQ2_XXS", kSuperBlock, int32_t(sizeof(BlockIQ2_XXS)), true, true, ActScheme::Q8_K},
    {DType::IQ2_XS, "IQ2_XS", kSuperBlock, int32_t(sizeof(BlockIQ2_XS)), true, true, ActScheme::Q8_K},
    {DType::IQ2_S, "IQ2_S", kSuperBlock, int32_t(sizeof(BlockIQ2_S)), true, true, ActScheme::Q8_K},
    {DType::IQ3_XXS, "IQ3_XXS", kSuperBlock, int32_t(sizeof(BlockIQ3_XXS)), true, true, ActScheme::Q8_K},
    {DType::IQ3_S, "IQ3_S", kSuperBlock, int32_t(sizeof(BlockIQ3_S)), true, true, ActScheme::Q8_K},
    {DType::Q8A, "Q8A", kQuantBlock, int32_t(sizeof(BlockQ8A)), false, true},
    {DType::Q4T, "Q4T", kQuantBlock, 16, false, true},  // nibbles only: its scales live in a side tensor
};
inline constexpr int kDTypeCount = 24;
static_assert(sizeof(kDTypeTraits) / sizeof(kDTypeTraits[0]) == kDTypeCount,
              "a DType was added or removed: update kDTypeTraits and every switch over DType");

// The type's row in kDTypeTraits, or -1 for an id that is no type (a corrupt file, a bad binding call). An
// index, not a pointer, so that it stays a constant expression under -fsanitize=undefined.
constexpr int dtype_index(DType t) {
  for (int i = 0; i < kDTypeCount; ++i)
    if (kDTypeTraits[i].type == t) return i;
  return -1;
}
inline const DTypeTraits* dtype_traits(DType t) {
  const int i = dtype_index(t);
  return i >= 0 ? &kDTypeTraits[i] : nullptr;
}
// Bytes per block of a type, as a compile-time constant (kernels on both sides index blocks with it).
constexpr int32_t dtype_block_bytes(DType t) { return dtype_index(t) >= 0 ? kDTypeTraits[dtype_index(t)].block_bytes : 0; }
static_assert(dtype_block_bytes(DType::Q4_0) == 18 && dtype_block_bytes(DType::Q4_1) == 20 &&
              dtype_block_bytes(DType::Q5_0) == 22 && dtype_block_bytes(DType::Q5_1) == 24 &&
              dtype_block_bytes(DType::Q8_0) == 34 && dtype_block_bytes(DType::Q4_K) == 144 &&
              dtype_block_bytes(DType::Q5_K) == 176 && dtype_block_bytes(DType::Q6_K) == 210,
              "GGUF block layouts");

bool dtype_is_quantized(DType t);
// Weights that the integer-dot matmul runs against Q8A activations.
bool dtype_is_integer_dot(DType t);
// Elements per block: 256 for K-quants, 32 for other quantized types, 1 for float types.
int64_t dtype_block_elems(DType t);
bool dtype_is_known(DType t);
const char* dtype_name(DType t);
// Bytes of one row of `n` elements; n must be a multiple of dtype_block_elems(t).
size_t dtype_row_bytes(DType t, int64_t n);

}  // namespace pyinfer
