// The weight types the device decodes a 32-element piece at a time with the CPU reference's decoder
// (kernels/piece_decode.h): the super-block types of llama.cpp's 2-3 bit mixes, IQ4 and MXFP4. The others have
// hand-written decoders (dequant.cuh, dot_q8a.cuh).
#pragma once
#include "graph/dtype.h"

namespace pyinfer::cuda {

__host__ __device__ constexpr bool is_piece_type(DType t) {
  return t == DType::Q2_K || t == DType::Q3_K || t == DType::IQ4_NL || t == DType::IQ4_XS || t == DType::MXFP4 ||
         t == DType::IQ2_XXS || t == DType::IQ2_XS || t == DType::IQ2_S || t == DType::IQ3_XXS || t == DType::IQ3_S;
}

}  // namespace pyinfer::cuda
