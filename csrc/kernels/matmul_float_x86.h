// The x86 matmul for float weights (F32, F16, BF16), shared by the AVX2 and the AVX-512 kernel tables like
// matmul_x86.h (which includes it). Weights are widened 8 at a time to F32 and multiplied into F32 activations
// with FMA: a tile of rows x tokens keeps one accumulator per pair, so each weight vector is loaded once for
// every token of the tile. The scalar path (matmul_float_weights) is the reference; the sums differ from it
// only in their order.
//
// Where float weights run: MoE routers (ffn_gate_inp stays F32 in every GGUF: 1 MiB a layer on a
// Qwen3-30B-A3B, read every token), F16 and BF16 model files, and tiny test models.
#pragma once
#include <immintrin.h>

#include <algorithm>

#include "kernels/float_weight.h"
#include "kernels/kernels.h"
#include "kernels/x86_common.h"

namespace pyinfer {
namespace {

// Elements [i, i + 8) of a weight row, as F32.
template <DType WT>
inline __m256 load8(const uint8_t* row, int64_t i) {
  if constexpr (WT == DType::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + i));
    if constexpr (WT == DType::F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // BF16: the high half of an F32
  }
}

// res[r][t] = dot(weight row wr[r], activation row xr[t]) over k elements.
template <DType WT, int NR, int NT>
inline void float_tile(const uint8_t* const* wr, const float* const* xr, int64_t k, float (&res)[NR][NT]) {
  __m256 acc[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 w[NR];
    for (int r = 0; r < NR; ++r) w[r] = load8<WT>(wr[r], i);
    for (int t = 0; t < NT; ++t) {
      const __m256 x = _mm256_loadu_ps(xr[t] + i);
      for (int r = 0; r < NR; ++r) acc[r][t] = _mm256_fmadd_ps(w[r], x, acc[r][t]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) {
      float s = hsum(acc[r][t]);
      for (int64_t j = i; j < k; ++j) s += float_weight_at<WT>(wr[r], j) * xr[t][j];
      res[r][t] = s;
    }
}

// Rows [r0, r1) for tokens [t0, t0 + NT); in decode (NT == 1) the rows ahead are prefetched into L2 with the
// same ramped distance as the integer path (x86_common.h's prefetch_rows_ahead: one stream per core leaves the
// hardware prefetcher short of misses in flight, and it stops at every 4 KiB page).
template <DType WT, int NR, int NT>
void float_rows_for_tokens(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0) {
  const float* xr[NT];
  for (int t = 0; t < NT; ++t)
    xr[t] = reinterpret_cast<const float*>(static_cast<const uint8_t*>(a.x) + (t0 + t) * a.x_row_bytes);
  auto row = [&](int64_t i) -> int64_t { return a.row_ids ? a.row_ids[i] : i; };
  // At most 64 KiB ahead: F32 rows are long (a 2048-wide router row is 8 KiB).
  const int64_t tiles_in_64k = std::max<int64_t>(1, (64 << 10) / int64_t(NR * a.w_row_bytes));
  const int64_t far = std::min(kAheadRows, tiles_in_64k * NR);
  int64_t ahead = r0 + NR;  // the first row not yet prefetched (the first tile is loaded on demand)
  int64_t r = r0;
  for (; r + NR <= r1; r += NR) {
    if (NT == 1 && a.n_tok == 1) prefetch_rows_ahead<NR>(a, row, ahead, std::min(r + far + NR, r1));
    const uint8_t* wr[NR];
    for (int i = 0; i < NR; ++i) wr[i] = a.row(row(r + i));
    float res[NR][NT];
    float_tile<WT, NR, NT>(wr, xr, a.k, res);
    for (int i = 0; i < NR; ++i)
      for (int t = 0; t < NT; ++t) a.dst[(t0 + t) * a.ldd + row(r + i)] = res[i][t];
  }
  for (; r < r1; ++r) {
    const uint8_t* wr[1] = {a.row(row(r))};
    float res[1][NT];
    float_tile<WT, 1, NT>(wr, xr, a.k, res);
    for (int t = 0; t < NT; ++t) a.dst[(t0 + t) * a.ldd + row(r)] = res[0][t];
  }
}

template <DType WT, typename S>
void float_matmul_typed(const MatMulArgs& a) {
  if (a.n_tok == 1) return float_rows_for_tokens<WT, S::float_decode_rows, 1>(a, a.r0, a.r1, 0);
  // Row chunks outer (at most 256 KiB of weights, which stay in L2 while every token tile passes over them).
  const int64_t chunk = std::max<int64_t>(S::rows, (256 << 10) / int64_t(a.w_row_bytes) / S::rows * S::rows);
  for (int64_t c0 = a.r0; c0 < a.r1; c0 += chunk) {
    const int64_t c1 = std::min(c0 + chunk, a.r1);
    int64_t t = 0;
    for (; t + S::tokens <= a.n_tok; t += S::tokens) float_rows_for_tokens<WT, S::rows, S::tokens>(a, c0, c1, t);
    for (; t < a.n_tok; ++t) float_rows_for_tokens<WT, S::rows, 1>(a, c0, c1, t);
  }
}

// F32, F16 and BF16 weights; false for any other type.
template <typename S>
bool float_matmul_x86(const MatMulArgs& a) {
  switch (a.wtype) {
    case DType::F32: float_matmul_typed<DType::F32, S>(a); return true;
    case DType::F16: float_matmul_typed<DType::F16, S>(a); return true;
    case DType::BF16: float_matmul_typed<DType::BF16, S>(a); return true;
    default: return false;
  }
}

}  // namespace
}  // namespace pyinfer
