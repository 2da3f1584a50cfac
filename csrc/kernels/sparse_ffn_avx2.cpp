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

// Two rows' 16-byte blocks b as one vector: the first in the low lane, the second in the high lane.
inline __m256i two_rows(const uint8_t* r0, const uint8_t* r1, int64_t b) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + 16 * b));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1 + 16 * b)), 1);
}

// Q4T in integers (quantize_group_coefs): four neurons at a time, their nibbles interleaved so that each
// column's bytes pair (r0, r2) in the low lane and (r1, r3) in the high lane, multiplied by the matching int8
// coefficient digits with maddubs and summed in int16 (at most 16 neurons per lane: |sum| <= 16 * 15 * 127 <
// 2^15). The lanes are added in int32 (their sum may not fit 16 bits) and scaled once per group and block.
void axpy_q4t(const AxpyRowsArgs& a) {
  const int64_t half = a.scales_stride / 2, width = a.c1 - a.c0;
  const __m256i mask = _mm256_set1_epi8(0x0f);
  int64_t ahead = 0;  // the first list position whose slice is not yet asked for
  const int64_t distance = axpy_ahead_rows(width / 2);
  for_each_q4t_group(a, [&](const Q4TGroup& g) {
    // Active rows are scattered: this thread's slices of the rows `distance` past this group are asked for.
    for (const int64_t upto = std::min(a.n, g.end + distance); ahead < upto; ++ahead) {
      const char* row = reinterpret_cast<const char*>(a.row(a.ids[ahead]) + a.c0 / 2);
      for (int64_t off = 0; off < width / 2; off += 64) prefetch_l2(row + off);
    }
    Q4TCoefs qc;
    quantize_group_coefs(a, g, qc);
    const uint8_t* rows[kQuantBlock];
    group_rows(a, g, qc.n4, rows);
    // Per quad and digit: (q0, q2) pairs in the low lane, (q1, q3) in the high lane.
    __m256i coef[kQuantBlock / 4], coef_lo[kQuantBlock / 4];
    for (int64_t k = 0; k < qc.n4; k += 4) {
      const auto pairs = [&](const int8_t* q) {
        const auto pair = [&](int i, int j) {
          return _mm_set1_epi16(int16_t(uint16_t(uint8_t(q[k + i])) | uint16_t(uint16_t(uint8_t(q[k + j])) << 8)));
        };
        return _mm256_inserti128_si256(_mm256_castsi128_si256(pair(0, 2)), pair(1, 3), 1);
      };
      coef[k / 4] = pairs(qc.q);
      coef_lo[k / 4] = pairs(qc.q_lo);
    }
    const uint16_t* scale = a.scales + int64_t(g.group) * a.scales_stride;
    const uint16_t* offset = scale + half;
    const __m256 d = _mm256_set1_ps(qc.d), d_lo = _mm256_set1_ps(qc.d_lo), cs = _mm256_set1_ps(g.coef_sum);
    for (int64_t b = a.c0 / kQuantBlock; b < a.c1 / kQuantBlock; ++b) {
      // columns 0-7, 8-15, 16-23, 24-31 of the block, for each digit
      __m256i acc[4], acc_lo[4];
      for (int j = 0; j < 4; ++j) acc[j] = acc_lo[j] = _mm256_setzero_si256();
      for (int64_t k = 0; k < qc.n4; k += 4) {
        const __m256i x01 = two_rows(rows[k], rows[k + 1], b), x23 = two_rows(rows[k + 2], rows[k + 3], b);
        const __m256i lo01 = _mm256_and_si256(x01, mask), hi01 = _mm256_and_si256(_mm256_srli_epi16(x01, 4), mask);
        const __m256i lo23 = _mm256_and_si256(x23, mask), hi23 = _mm256_and_si256(_mm256_srli_epi16(x23, 4), mask);
        const __m256i n[4] = {_mm256_unpacklo_epi8(lo01, lo23), _mm256_unpackhi_epi8(lo01, lo23),
                              _mm256_unpacklo_epi8(hi01, hi23), _mm256_unpackhi_epi8(hi01, hi23)};
        const __m256i c = coef[k / 4], c_lo = coef_lo[k / 4];
        for (int j = 0; j < 4; ++j) {
          acc[j] = _mm256_add_epi16(acc[j], _mm256_maddubs_epi16(n[j], c));
          acc_lo[j] = _mm256_add_epi16(acc_lo[j], _mm256_maddubs_epi16(n[j], c_lo));
        }
      }
      const auto lanes = [](__m256i v) {  // the two lanes' int16 sums added in int32, as floats
        return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(v)),
                                                   _mm256_cvtepi16_epi32(_mm256_extracti128_si256(v, 1))));
      };
      for (int j = 0; j < 4; ++j) {
        const int64_t col = b * kQuantBlock + 8 * j;
        const __m256 t = _mm256_fmadd_ps(lanes(acc_lo[j]), d_lo, _mm256_mul_ps(lanes(acc[j]), d));
        const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scale + col)));
        const __m256 o = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(offset + col)));
        const __m256 y = _mm256_fmadd_ps(s, t, _mm256_loadu_ps(a.y + col));
        _mm256_storeu_ps(a.y + col, _mm256_fmadd_ps(o, cs, y));
      }
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
