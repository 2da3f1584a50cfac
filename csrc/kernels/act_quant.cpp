#include "kernels/act_quant.h"

#include "kernels/fp16.h"

namespace pyinfer {
namespace {

float round_fp16(float v) { return fp16_to_fp32(fp32_to_fp16(v)); }

int32_t block_sum(const BlockQ8A& b) {
  int32_t s = 0;
  for (int j = 0; j < kQuantBlock; ++j) s += b.qs[j];
  return s;
}

}  // namespace

void quantize_activations(const KernelTable& k, ActScheme scheme, const float* x, BlockQ8A* y, int64_t n) {
  if (scheme == ActScheme::Q8_K && n % kSuperBlock == 0) return k.quantize_q8k(x, y, n);
  k.quantize_q8a(x, y, n);  // q = nearest(127 / amax * x) per 32, as llama.cpp's quantize_row_q8_0 / q8_1
  if (scheme == ActScheme::Own) return;
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    BlockQ8A& blk = y[b];
    if (scheme == ActScheme::Q8_1) {  // both stored in fp16: d, and d x sum from the unrounded d
      blk.s = round_fp16(blk.s);
      blk.d = round_fp16(blk.d);
    } else {  // Q8_0 (and Q8_K on a row that is not whole super-blocks): only d, in fp16; s follows it
      blk.d = round_fp16(blk.d);
      blk.s = blk.d * float(block_sum(blk));
    }
  }
}

}  // namespace pyinfer
