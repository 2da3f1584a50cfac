// Load-time repacking of a down matrix into the neuron-major rows the sparse FFN reads (one row per neuron,
// in the plan's hot-first order): the model's [d_model, d_ff] rows are decoded, transposed through the
// permutation and, for quantized models, re-quantized to Q8_0 along the new rows. A 7B model's 32 downs took
// 40 s in numpy on 2 cores; this is the same arithmetic (ggml's Q8_0 rounding) on threads.
#pragma once
#include <cstdint>

#include "graph/dtype.h"

namespace pyinfer {

// src: `rows` rows of `cols` elements of `type`, `src_stride` bytes apart. Writes dst row k = column perm[k]
// of src, for k < n: F32 [n, rows] when out == F32, or Q8_0 blocks [n, rows / 32 * 34] when out == Q8_0
// (rows a multiple of 32). Splits the work over `threads` threads.
void neuron_major(DType type, const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols,
                  const int32_t* perm, int64_t n, DType out, uint8_t* dst, int threads);

}  // namespace pyinfer
