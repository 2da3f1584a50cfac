// AVX2 + FMA + F16C neuron-major axpy (compiled with those flags alone; called only after the CPU check).
// Four neurons share each load/store of the output slice, so y traffic is a quarter of a plain axpy.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "kernels/kernels.h"
#include "kernels/sparse_ffn_walk.h"

namespace pyinfer {
namespace {

// 8 int8 weights -> 8 floats.
inline __m256 load8(const int8_t* q) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}

// 8 nibble values (as bytes 0..15 in the low half of v) -> 8 floats.
inline __m256 u8x8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

template <int NN>
void axpy_group_q4_1(const AxpyRowsArgs& a, int64_t k) {
  const auto rows = active_rows<BlockQ4_1, NN>(a, k);
  const __m128i mask = _mm_set1_epi8(0x0f);
  for (int64_t b = a.c0 / kQuantBlock; b < a.c1 / kQuantBlock; ++b) {
    float* y = a.y + b * kQuantBlock;
    __m256 acc[4];
    for (int j = 0; j < 4; ++j) acc[j] = _mm256_loadu_ps(y + 8 * j);
    float offset = 0.f;  // the m terms are the same for all 32 elements: summed once per block
    for (int i = 0; i < NN; ++i) {
      const BlockQ4_1& blk = rows[i][b];
      const float c = a.coef[k + i];
      const __m256 s = _mm256_set1_ps(c * _cvtsh_ss(blk.d));
      offset += c * _cvtsh_ss(blk.m);
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
      const __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
      acc[0] = _mm256_fmadd_ps(u8x8(lo), s, acc[0]);
      acc[1] = _mm256_fmadd_ps(u8x8(_mm_srli_si128(lo, 8)), s, acc[1]);
      acc[2] = _mm256_fmadd_ps(u8x8(hi), s, acc[2]);
      acc[3] = _mm256_fmadd_ps(u8x8(_mm_srli_si128(hi, 8)), s, acc[3]);
    }
    const __m256 o = _mm256_set1_ps(offset);
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(y + 8 * j, _mm256_add_ps(acc[j], o));
  }
}

template <int NN>
void axpy_group(const AxpyRowsArgs& a, int64_t k) {
  const auto rows = active_rows<BlockQ8_0, NN>(a, k);
  for (int64_t b = a.c0 / kQuantBlock; b < a.c1 / kQuantBlock; ++b) {
    float* y = a.y + b * kQuantBlock;
    __m256 acc[4];
    for (int j = 0; j < 4; ++j) acc[j] = _mm256_loadu_ps(y + 8 * j);
    for (int i = 0; i < NN; ++i) {
      const BlockQ8_0& blk = rows[i][b];
      const __m256 s = _mm256_set1_ps(a.coef[k + i] * _cvtsh_ss(blk.d));
      for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_ps(load8(blk.qs + 8 * j), s, acc[j]);
    }
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(y + 8 * j, acc[j]);
  }
}

// Q4T: t[c0, c1) += sum of NN neurons' coef * nibbles, four 8-float vectors per 32-element block.
template <int NN>
void q4t_accumulate(const AxpyRowsArgs& a, int64_t k) {
  const auto rows = active_rows<uint8_t, NN>(a, k);
  const __m128i mask = _mm_set1_epi8(0x0f);
  for (int64_t b = a.c0 / kQuantBlock; b < a.c1 / kQuantBlock; ++b) {
    float* t = a.tmp + b * kQuantBlock - a.c0;
    __m256 acc[4];
    for (int j = 0; j < 4; ++j) acc[j] = _mm256_loadu_ps(t + 8 * j);
    for (int i = 0; i < NN; ++i) {
      const __m256 c = _mm256_set1_ps(a.coef[k + i]);
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + 16 * b));
      const __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
      acc[0] = _mm256_fmadd_ps(u8x8(lo), c, acc[0]);
      acc[1] = _mm256_fmadd_ps(u8x8(_mm_srli_si128(lo, 8)), c, acc[1]);
      acc[2] = _mm256_fmadd_ps(u8x8(hi), c, acc[2]);
      acc[3] = _mm256_fmadd_ps(u8x8(_mm_srli_si128(hi, 8)), c, acc[3]);
    }
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(t + 8 * j, acc[j]);
  }
}

void axpy_q4t(const AxpyRowsArgs& a) {
  const int64_t half = a.scales_stride / 2, width = a.c1 - a.c0;
  for_each_q4t_group(a, [&](const Q4TGroup& g) {
    for (int64_t c = 0; c < width; c += 8) _mm256_storeu_ps(a.tmp + c, _mm256_setzero_ps());
    // Active rows are scattered: prefetch this thread's slice of the next group's rows while this one runs.
    for (int64_t p = g.end; p < a.n && a.ids[p] / kQuantBlock == g.group + 1; ++p) {
      const char* row = reinterpret_cast<const char*>(a.row(a.ids[p]) + a.c0 / 2);
      for (int64_t off = 0; off < width / 2; off += 64) _mm_prefetch(row + off, _MM_HINT_T0);
    }
    for_rows_by4(g.begin, g.end, [&](int64_t k) { q4t_accumulate<4>(a, k); }, [&](int64_t k) { q4t_accumulate<1>(a, k); });
    const uint16_t* scale = a.scales + int64_t(g.group) * a.scales_stride;
    const uint16_t* offset = scale + half;
    const __m256 cs = _mm256_set1_ps(g.coef_sum);
    for (int64_t c = a.c0; c < a.c1; c += 8) {
      const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scale + c)));
      const __m256 o = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(offset + c)));
      __m256 y = _mm256_loadu_ps(a.y + c);
      y = _mm256_fmadd_ps(s, _mm256_loadu_ps(a.tmp + c - a.c0), y);
      _mm256_storeu_ps(a.y + c, _mm256_fmadd_ps(o, cs, y));
    }
  });
}

}  // namespace

void axpy_rows_avx2(const AxpyRowsArgs& a) {
  axpy_dispatch(a, axpy_q4t, [&](int64_t k, auto nn) { axpy_group_q4_1<decltype(nn)::value>(a, k); },
                [&](int64_t k, auto nn) { axpy_group<decltype(nn)::value>(a, k); });
}

}  // namespace pyinfer
#endif
