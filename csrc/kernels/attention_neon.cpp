// NEON tiled attention: the matrix-product tile (attention_tile_gemm.h) on 4 lanes for every block, decode's
// few rows included (one row vector holds them), and cache rows to floats 4 at a time.
#if defined(__aarch64__)
#include <arm_neon.h>

#include "kernels/attention.h"

#include <cstring>
#include "kernels/attention_tile_gemm.h"
#include "kernels/fp16.h"

namespace pyinfer {
namespace {

// exp(x) for 4 lanes: the AVX2 file's exp8 (Cephes' range reduction and degree-5 polynomial) in NEON.
inline float32x4_t exp4(float32x4_t x) {
  x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.33654f)), vdupq_n_f32(88.37626f));
  const float32x4_t fx = vrndmq_f32(vfmaq_f32(vdupq_n_f32(0.5f), x, vdupq_n_f32(1.44269504088896341f)));
  x = vfmsq_f32(x, fx, vdupq_n_f32(0.693359375f));
  x = vfmsq_f32(x, fx, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t y = vdupq_n_f32(1.9875691500e-4f);
  y = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), y, x);
  y = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), y, x);
  y = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), y, x);
  y = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), y, x);
  y = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), y, x);
  y = vfmaq_f32(vaddq_f32(x, vdupq_n_f32(1.f)), y, vmulq_f32(x, x));
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(fx), vdupq_n_s32(127)), 23);
  return vmulq_f32(y, vreinterpretq_f32_s32(e));
}

struct NeonLanes {
  using V = float32x4_t;
  using I = int32x4_t;
  using M = uint32x4_t;
  static constexpr int W = 4;
  static V load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, V x) { vst1q_f32(p, x); }
  static V set1(float x) { return vdupq_n_f32(x); }
  static V zero() { return vdupq_n_f32(0.f); }
  static V fmadd(V a, V b, V c) { return vfmaq_f32(c, a, b); }
  static V mul(V a, V b) { return vmulq_f32(a, b); }
  static V add(V a, V b) { return vaddq_f32(a, b); }
  static V sub(V a, V b) { return vsubq_f32(a, b); }
  static V max(V a, V b) { return vmaxq_f32(a, b); }
  static V exp(V x) { return exp4(x); }
  static I loadi(const int32_t* p) { return vld1q_s32(p); }
  static M visible(int j, I lo, I hi) {
    const int32x4_t jj = vdupq_n_s32(j);
    return vandq_u32(vcleq_s32(lo, jj), vcgtq_s32(hi, jj));
  }
  static V select(M m, V x, V fill) { return vbslq_f32(m, x, fill); }
  static M below(V x, V y) { return vcltq_f32(x, y); }
};

}  // namespace

void attn_tile_neon(const AttnTileArgs& a) {
  if (a.head_dim % 4 || attn_v_dim(a) % 4) return attn_tile_generic(a);
  // keys x row vectors 4 x 4 and rows x value vectors 4 x 4: 16 accumulators each of the 32 registers
  attn_gemm::tile<NeonLanes, 4, 4, 4, 4>(a);
}

namespace {
inline void kv_row_to_f32(DType type, const uint8_t* src, float* dst, int64_t n) {
  if (type == DType::F32) {  // an fp32 cache (llama.cpp's -ctk f32): the row as it is
    std::memcpy(dst, src, size_t(n) * sizeof(float));
    return;
  }
  if (type == DType::Q8_0) {
    const auto* blocks = reinterpret_cast<const BlockQ8_0*>(src);
    for (int64_t b = 0; b < n / kQuantBlock; ++b) {
      const float32x4_t d = vdupq_n_f32(fp16_to_fp32(blocks[b].d));
      for (int i = 0; i < kQuantBlock; i += 8) {
        const int16x8_t q = vmovl_s8(vld1_s8(blocks[b].qs + i));
        float* o = dst + b * kQuantBlock + i;
        vst1q_f32(o, vmulq_f32(d, vcvtq_f32_s32(vmovl_s16(vget_low_s16(q)))));
        vst1q_f32(o + 4, vmulq_f32(d, vcvtq_f32_s32(vmovl_s16(vget_high_s16(q)))));
      }
    }
    return;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + i))));
  for (; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
}
}  // namespace

void kv_to_f32_neon(DType type, const uint8_t* src, size_t stride, float* dst, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) kv_row_to_f32(type, src + size_t(r) * stride, dst + r * n, n);
}

}  // namespace pyinfer
#endif
