// Portable reference kernels. Every ISA path is tested against these.
#include <cmath>

#include "kernels/fp16.h"
#include "kernels/attention.h"
#include "kernels/kernels.h"
#include "kernels/ops_float.h"
#include "kernels/quant_blocks.h"

namespace pyinfer {
namespace {

// One weight piece against one activation block, as every SIMD path sums it (matmul_x86.h): the exact integer dot
// (Q6_K's halves times their scales), scaled by d_w * d_x into `acc`, the offset m * s into `off`, both fused.
// Q4_K/Q5_K's d_w is d * sc, as their SIMD decoders form it; the legacy types' sc is 1.
// Sub-scale types (Q6_K, Q3_K, Q2_K, IQ2_XS, IQ2_S) scale each half's integer dot; Q2_K's half mins are a second
// integer dot (the mins against the halves' activation sums) times -dmin * d_x, in the offsets' chain.
inline void dot_piece(DType type, const Piece32& p, const BlockQ8A& x, float& acc, float& off) {
  int32_t half[2] = {0, 0}, xsum[2] = {0, 0};
  for (int j = 0; j < 32; ++j) {
    half[j / 16] += int32_t(p.q[j]) * x.qs[j];
    xsum[j / 16] += x.qs[j];
  }
  if (piece_has_sub_scales(type))
    acc = std::fma(float(p.scale[0] * half[0] + p.scale[1] * half[1]), p.d * x.d, acc);
  else
    acc = std::fma(float(half[0] + half[1]), (p.d * float(p.scale[0])) * x.d, acc);
  if (piece_has_half_mins(type))
    off = std::fma(float(p.mins[0] * xsum[0] + p.mins[1] * xsum[1]), p.m * x.d, off);
  else
    off = std::fma(p.m, x.s, off);
}

}  // namespace

void matmul_scalar(const MatMulArgs& a) {
  if (!dtype_is_quantized(a.wtype)) return matmul_float_weights(a);
  const int64_t nb = a.k / kQuantBlock;
  for (int64_t t = 0; t < a.n_tok; ++t) {
    const auto* x = reinterpret_cast<const BlockQ8A*>(static_cast<const uint8_t*>(a.x) + t * a.x_row_bytes);
    float* out = a.dst + t * a.ldd;
    for (int64_t i = a.r0; i < a.r1; ++i) {
      const int64_t r = a.row_ids ? a.row_ids[i] : i;
      const uint8_t* w = a.row(r);
      float acc = 0.f, off = 0.f;
      Piece32 p;
      for (int64_t b = 0; b < nb; ++b) {
        decode_piece(a.wtype, w, b, p);
        dot_piece(a.wtype, p, x[b], acc, off);
      }
      out[r] = acc + off;
    }
  }
}

namespace {

void quantize_q8a_scalar(const float* x, BlockQ8A* y, int64_t n) {
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float* xb = x + b * kQuantBlock;
    float amax = 0.f;
    for (int j = 0; j < kQuantBlock; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float d = amax / 127.f, id = d > 0.f ? 127.f / amax : 0.f;
    int32_t sum = 0;
    for (int j = 0; j < kQuantBlock; ++j) {
      const int q = int(std::nearbyint(xb[j] * id));  // round half to even, like the SIMD paths
      y[b].qs[j] = int8_t(q);
      sum += q;
    }
    y[b].d = d;
    y[b].s = d * float(sum);
  }
}

// llama.cpp's quantize_row_q8_K_ref: one scale per 256 from the largest |x|, q = nearest(127 / amax * x) (its
// -127 / max form negates both q and the scale, which leaves every product as it is), the scale 1 / (127 / amax)
// in fp32. Each Q8A block of the 256 carries that scale and its own sum.
void quantize_q8k_scalar(const float* x, BlockQ8A* y, int64_t n) {
  constexpr int64_t kPer = kSuperBlock / kQuantBlock;
  for (int64_t sb = 0; sb < n / kSuperBlock; ++sb) {
    const float* xs = x + sb * kSuperBlock;
    float amax = 0.f;
    for (int64_t j = 0; j < kSuperBlock; ++j) amax = std::fmax(amax, std::fabs(xs[j]));
    const float iscale = amax > 0.f ? 127.f / amax : 0.f;
    const bool ok = std::isfinite(iscale) && iscale > 0.f;  // a subnormal amax gives no finite scale: zeros
    const float d = ok ? 1.f / iscale : 0.f, id = ok ? iscale : 0.f;
    for (int64_t b = 0; b < kPer; ++b) {
      BlockQ8A& blk = y[sb * kPer + b];
      int32_t sum = 0;
      for (int j = 0; j < kQuantBlock; ++j) {
        const int q = int(std::nearbyint(xs[b * kQuantBlock + j] * id));  // half to even, as nearest_int
        blk.qs[j] = int8_t(q);
        sum += q;
      }
      blk.d = d;
      blk.s = d * float(sum);
    }
  }
}

float dot_f16_f32_scalar(const uint16_t* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += fp16_to_fp32(a[i]) * b[i];
  return s;
}

void axpy_f16_f32_scalar(float alpha, const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * fp16_to_fp32(x[i]);
}

void f32_to_f16_scalar(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

}  // namespace

void matmul_float_weights(const MatMulArgs& a) {
  for (int64_t t = 0; t < a.n_tok; ++t) {
    const float* x = reinterpret_cast<const float*>(static_cast<const uint8_t*>(a.x) + t * a.x_row_bytes);
    float* out = a.dst + t * a.ldd;
    for (int64_t i = a.r0; i < a.r1; ++i) {
      const int64_t r = a.row_ids ? a.row_ids[i] : i;
      const uint8_t* w = a.row(r);
      float s = 0.f;
      if (a.wtype == DType::F32) {
        const float* wf = reinterpret_cast<const float*>(w);
        for (int64_t i = 0; i < a.k; ++i) s += wf[i] * x[i];
      } else {
        const uint16_t* wh = reinterpret_cast<const uint16_t*>(w);
        const bool bf = a.wtype == DType::BF16;
        for (int64_t i = 0; i < a.k; ++i) s += (bf ? bf16_to_fp32(wh[i]) : fp16_to_fp32(wh[i])) * x[i];
      }
      out[r] = s;
    }
  }
}

const KernelTable& kernels_scalar() {
  static const KernelTable table{"scalar", matmul_scalar, quantize_q8a_scalar, quantize_q8k_scalar, dot_f16_f32_scalar,
                                 axpy_f16_f32_scalar, f32_to_f16_scalar, axpy_rows_scalar,
                                 attn_tile_generic, kv_to_f32_generic, gelu_mul_generic,
                                 silu_mul_generic};
  return table;
}

}  // namespace pyinfer
