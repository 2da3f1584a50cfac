// AVX2 + FMA + F16C kernels. This file alone is compiled with those flags; it is only
// called after select_kernels() has checked the CPU (never -march=native).
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cmath>

#include "kernels/attention.h"
#include "kernels/kernels.h"
#include "kernels/matmul_x86.h"
#include "kernels/ops_float.h"

namespace pyinfer {
namespace {

inline float hmax_avx2(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// One block of 32 with multiplier id: q = nearest(x * id) (half to even), y.d = d, y.s = d * sum(q).
inline void quantize_block_avx2(const float* xb, float id, float d, BlockQ8A& y) {
  const __m256 vid = _mm256_set1_ps(id);
  __m256i q[4];
  __m256i qsum = _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j) {
    q[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * j), vid),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    qsum = _mm256_add_epi32(qsum, q[j]);
  }
  // packs work within 128-bit lanes; the permute restores element order.
  const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
  const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
  const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
  const __m256i ordered = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y.qs), ordered);
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(qsum), _mm256_extracti128_si256(qsum, 1));
  s = _mm_hadd_epi32(s, s);
  s = _mm_hadd_epi32(s, s);
  y.d = d;
  y.s = d * float(_mm_cvtsi128_si32(s));
}

inline __m256 abs_max_avx2(const float* x, int64_t n, __m256 amax) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t j = 0; j < n; j += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
  return amax;
}

void quantize_q8a_avx2(const float* x, BlockQ8A* y, int64_t n) {
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float* xb = x + b * kQuantBlock;
    const float mx = hmax_avx2(abs_max_avx2(xb, kQuantBlock, _mm256_setzero_ps()));
    quantize_block_avx2(xb, mx > 0.f ? 127.f / mx : 0.f, mx / 127.f, y[b]);
  }
}

// quantize_q8k_scalar's bits (matmul_scalar.cpp): one multiplier per 256.
void quantize_q8k_avx2(const float* x, BlockQ8A* y, int64_t n) {
  constexpr int64_t kPer = kSuperBlock / kQuantBlock;
  for (int64_t sb = 0; sb < n / kSuperBlock; ++sb) {
    const float* xs = x + sb * kSuperBlock;
    const float mx = hmax_avx2(abs_max_avx2(xs, kSuperBlock, _mm256_setzero_ps()));
    const float iscale = mx > 0.f ? 127.f / mx : 0.f;
    const bool ok = std::isfinite(iscale) && iscale > 0.f;
    const float d = ok ? 1.f / iscale : 0.f, id = ok ? iscale : 0.f;
    for (int64_t b = 0; b < kPer; ++b) quantize_block_avx2(xs + b * kQuantBlock, id, d, y[sb * kPer + b]);
  }
}

float dot_f16_f32_avx2(const uint16_t* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i))),
                          _mm256_loadu_ps(b + i), acc);
  float s = hsum(acc);
  for (; i < n; ++i) s += _cvtsh_ss(a[i]) * b[i];
  return s;
}

void axpy_f16_f32_avx2(float alpha, const uint16_t* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += alpha * _cvtsh_ss(x[i]);
}

void f32_to_f16_avx2(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

// GELU(gate) * up: F16C rounds 8 gates to fp16 and their bits index the shared table (ops_float.cpp), so
// the values equal gelu_tanh()'s; |gate| >= 10 takes 0 or gate, as there.
void gelu_mul_avx2(const float* gate, const float* up, float* y, int64_t n) {
  const float* table = gelu_fp16_table();
  const __m256 lo = _mm256_set1_ps(-10.f), hi = _mm256_set1_ps(10.f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256i bits = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(g, _MM_FROUND_TO_NEAREST_INT));
    __m256 v = _mm256_i32gather_ps(table, bits, 4);
    v = _mm256_blendv_ps(v, g, _mm256_cmp_ps(g, hi, _CMP_GE_OQ));
    v = _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps(g, lo, _CMP_LE_OQ));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(v, _mm256_loadu_ps(up + i)));
  }
  if (i < n) gelu_mul_generic(gate + i, up + i, y + i, n - i);
}

// silu_mul_one (ops_float.h), 8 lanes: the same fused steps in the same order, so the same bits.
void silu_mul_avx2(const float* gate, const float* up, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 neg = _mm256_xor_ps(g, _mm256_set1_ps(-0.f));  // -g exactly, as the scalar negation
    const __m256 x = _mm256_min_ps(_mm256_max_ps(neg, _mm256_set1_ps(kSiluClampLo)), _mm256_set1_ps(kSiluClampHi));
    const __m256 nf = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT |
                                      _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(nf, _mm256_set1_ps(-kLn2Hi), x);
    r = _mm256_fmadd_ps(nf, _mm256_set1_ps(-kLn2Lo), r);
    __m256 p = _mm256_set1_ps(kExpC[6]);
    for (int k = 5; k >= 0; --k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpC[k]));
    const __m256 scale = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nf), _mm256_set1_epi32(127)), 23));
    const __m256 den = _mm256_fmadd_ps(p, scale, _mm256_set1_ps(1.f));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(g, den), _mm256_loadu_ps(up + i)));
  }
  if (i < n) silu_mul_generic(gate + i, up + i, y + i, n - i);
}

}  // namespace

const KernelTable* kernels_avx2() {
  // Decode 4 rows a tile, as the AVX-512 table; prefill one lane group (8 rows) x 4 tokens, which 16 registers hold
  // (matmul_x86.h's TileShape).
  static const KernelTable table{"avx2", matmul_x86<TileShape<1, 2, 4, 1>>, quantize_q8a_avx2, quantize_q8k_avx2,
                                 dot_f16_f32_avx2,
                                 axpy_f16_f32_avx2, f32_to_f16_avx2, axpy_rows_avx2,
                                 attn_tile_avx2, kv_to_f32_avx2, gelu_mul_avx2, silu_mul_avx2};
  return &table;
}

}  // namespace pyinfer
#else
#include "kernels/kernels.h"
namespace pyinfer {
const KernelTable* kernels_avx2() { return nullptr; }
}  // namespace pyinfer
#endif
