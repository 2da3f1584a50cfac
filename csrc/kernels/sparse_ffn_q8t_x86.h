// The Q8T input-sparse axpy for the x86 tables (graph/dtype.h: Q8T), in integers as the scalar reference sums:
// per group of 32 inputs, four active rows at a time, their bytes interleaved per column into dwords (two unpack
// steps) and multiplied by the rows' four coefficient digits in one dot4 per 8 columns. The float work is one
// scale and one fused multiply-add per column and group. Every table gives the scalar bits.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/kernels.h"
#include "kernels/prefetch.h"
#include "kernels/sparse_ffn_walk.h"

namespace pyinfer {
namespace {  // each ISA file its own copy, compiled with its own flags

// AVX-512 VNNI (on 256-bit vectors): the biased bytes w + 128 are vpdpbusd's unsigned operand as stored; the
// group's 128 * sum of digits comes off after the sum.
struct Q8TDotVnni {
  static constexpr bool kBiased = true;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  static __m256i dot(__m256i acc, __m256i u, __m256i coef) { return _mm256_dpbusd_epi32(acc, u, coef); }
#else
  static __m256i dot(__m256i acc, __m256i, __m256i) { return acc; }  // never called: the table needs VNNI
#endif
};

// AVX2: w itself (the bias flipped off), its sign moved onto the coefficient so maddubs multiplies |w| <= 127 by
// a signed digit (no pair can saturate: 2 * 127 * 127 < 2^15), then madd sums the pairs into int32.
struct Q8TDotAvx2 {
  static constexpr bool kBiased = false;
  static __m256i dot(__m256i acc, __m256i u, __m256i coef) {
    const __m256i w = _mm256_xor_si256(u, _mm256_set1_epi8(char(0x80)));
    const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(coef, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
};

// Four rows' 32 columns from column c into acc: per 128-bit lane (16 columns), dwords of columns 0-3, 4-7, 8-11
// and 12-15, each holding the four rows' bytes.
template <typename Dot>
inline void q8t_quad(const uint8_t* const* rows, int64_t c, __m256i coef, __m256i* acc) {
  const auto load = [&](int i) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[i] + c)); };
  const __m256i r0 = load(0), r1 = load(1), r2 = load(2), r3 = load(3);
  const __m256i lo01 = _mm256_unpacklo_epi8(r0, r1), hi01 = _mm256_unpackhi_epi8(r0, r1);
  const __m256i lo23 = _mm256_unpacklo_epi8(r2, r3), hi23 = _mm256_unpackhi_epi8(r2, r3);
  acc[0] = Dot::dot(acc[0], _mm256_unpacklo_epi16(lo01, lo23), coef);
  acc[1] = Dot::dot(acc[1], _mm256_unpackhi_epi16(lo01, lo23), coef);
  acc[2] = Dot::dot(acc[2], _mm256_unpacklo_epi16(hi01, hi23), coef);
  acc[3] = Dot::dot(acc[3], _mm256_unpackhi_epi16(hi01, hi23), coef);
}

// y[c, c + 32) += (d_coef * scale) * (sum - bias), the sums put back in column order first (columns 0-7 and
// 16-23 are acc[0] and acc[1]'s lanes, 8-15 and 24-31 acc[2] and acc[3]'s).
inline void q8t_store(const __m256i* acc, __m256i bias, __m256 d, const uint16_t* scale, float* y, int64_t c) {
  const __m256i t[4] = {_mm256_permute2x128_si256(acc[0], acc[1], 0x20), _mm256_permute2x128_si256(acc[2], acc[3], 0x20),
                        _mm256_permute2x128_si256(acc[0], acc[1], 0x31), _mm256_permute2x128_si256(acc[2], acc[3], 0x31)};
  for (int j = 0; j < 4; ++j) {
    const int64_t col = c + 8 * j;
    const __m256 s = _mm256_mul_ps(d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scale + col))));
    const __m256 sum = _mm256_cvtepi32_ps(_mm256_sub_epi32(t[j], bias));
    _mm256_storeu_ps(y + col, _mm256_fmadd_ps(s, sum, _mm256_loadu_ps(y + col)));
  }
}

// Per group, four rows at a time stream across the thread's whole slice (four sequential streams, as the Q8_0
// axpy reads), their sums kept per column in a stack buffer; then the group's scale step. Sweeping the columns
// with all of a group's rows at once (up to 32 streams in flight) ran at 13 GB/s where the Q8_0 float axpy read
// 23 (7B-shaped down, every input active).
constexpr int64_t kQ8TSliceMax = 4096;  // columns per call at most: the slice is cut into pieces of this width

template <typename Dot>
void axpy_q8t_slice(const AxpyRowsArgs& a) {
  const int64_t width = a.c1 - a.c0, chunks = width / kQuantBlock;
  alignas(32) int32_t sums[kQ8TSliceMax];  // per chunk: its four dword vectors (lane order, q8t_quad's)
  int64_t ahead = 0;  // the first list position whose slice is not yet asked for
  const int64_t distance = axpy_ahead_rows(width);
  for_each_q4t_group(a, [&](const Q4TGroup& g) {
    Q4TCoefs qc;
    quantize_group_coefs(a, g, qc);
    const uint8_t* rows[kQuantBlock];
    group_rows(a, g, qc.n4, rows);
    for (int64_t k = 0; k < qc.n4; k += 4) {
      for (const int64_t upto = std::min(a.n, g.begin + k + 4 + distance); ahead < upto; ++ahead) {
        const char* row = reinterpret_cast<const char*>(a.row(a.ids[ahead]) + a.c0);
        for (int64_t off = 0; off < width; off += 64) prefetch_l2(row + off);
      }
      const __m256i coef = _mm256_set1_epi32(int32_t(uint32_t(uint8_t(qc.q[k])) | uint32_t(uint8_t(qc.q[k + 1])) << 8 |
                                                     uint32_t(uint8_t(qc.q[k + 2])) << 16 |
                                                     uint32_t(uint8_t(qc.q[k + 3])) << 24));
      for (int64_t ch = 0; ch < chunks; ++ch) {
        __m256i* acc = reinterpret_cast<__m256i*>(sums + 32 * ch);
        __m256i v[4];
        for (int j = 0; j < 4; ++j) v[j] = k == 0 ? _mm256_setzero_si256() : _mm256_load_si256(acc + j);
        q8t_quad<Dot>(rows + k, a.c0 + ch * kQuantBlock, coef, v);
        for (int j = 0; j < 4; ++j) _mm256_store_si256(acc + j, v[j]);
      }
    }
    const __m256i bias = _mm256_set1_epi32(Dot::kBiased ? q8t_bias(qc) : 0);
    const __m256 d = _mm256_set1_ps(qc.d);
    const uint16_t* scale = a.scales + int64_t(g.group) * a.scales_stride;
    for (int64_t ch = 0; ch < chunks; ++ch)
      q8t_store(reinterpret_cast<const __m256i*>(sums + 32 * ch), bias, d, scale, a.y, a.c0 + ch * kQuantBlock);
  });
}

template <typename Dot>
void axpy_q8t_x86(const AxpyRowsArgs& a) {
  for (int64_t c = a.c0; c < a.c1; c += kQ8TSliceMax) {  // (a slice wider than the buffer: piece by piece)
    AxpyRowsArgs piece = a;
    piece.c0 = c;
    piece.c1 = std::min(a.c1, c + kQ8TSliceMax);
    axpy_q8t_slice<Dot>(piece);
  }
}

}  // namespace
}  // namespace pyinfer
