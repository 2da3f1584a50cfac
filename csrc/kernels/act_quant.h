// Activations quantized for an integer dot the way llama.cpp quantizes them for the weight's type (its
// vec_dot_type; graph/dtype.h ActScheme), so that a quantized file gives llama.cpp's logits, not only its
// quality: on a tiny random model the rounding of one scheme against another moved logits by 10-60% of the
// largest (bench/arch_check.py, before). Every scheme is stored as Q8A blocks of 32 (scale, scale x sum, bytes),
// so the matmuls of every table read them unchanged.
#pragma once
#include <cstdint>

#include "graph/dtype.h"
#include "kernels/kernels.h"

namespace pyinfer {

// y: n / 32 blocks; n % 32 == 0 (Q8_K: n % 256 == 0, else blocks of 32 as Q8_0).
void quantize_activations(const KernelTable& k, ActScheme scheme, const float* x, BlockQ8A* y, int64_t n);

}  // namespace pyinfer
