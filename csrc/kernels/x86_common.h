// Helpers of the x86 matmuls (matmul_x86.h for integer-dot weights, matmul_float_x86.h for float weights),
// compiled once per kernel table with its ISA flags. Everything is in an anonymous namespace, so the AVX2 and
// AVX-512 builds never meet at link time.
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"

namespace pyinfer {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Decode's prefetch distance in rows (32, 64 and 128 measured alike) where rows are gathered or paged.
constexpr int64_t kAheadRows = 64;
// Decode's prefetch distance in bytes where a thread's rows are one contiguous run (matmul_x86.h gemv_rows). On a
// 2-core Zen 4 VM, one thread streaming a 256 MB Q8_0 ffn_down of 8,960-element rows: 16, 11, 19, 32, 33 and 32
// GB/s at 1, 4, 16, 64, 128 and 256 KiB ahead (into L2, 1 MiB a core there).
constexpr int64_t kAheadBytes = 128 << 10;

// Decode streams each weight once from memory: the rows ahead of the tile being computed are asked for into L2
// before they are needed. One sequential stream per core leaves the hardware prefetcher short of misses in
// flight: on a 2-core Xeon VM this took Gemma 3's Q8_0 output head from 15.5-18.7 ms to 9.2-11 ms. Into L2
// (T1), not L1: 64 rows ahead is 43 KiB of that head's rows, more than a 32 KiB L1 holds, so on a Zen 4 VM a T0
// prefetch was evicted before use (head 11-17 ms, 10-13 GB/s); T1 took it to 5.0-6.4 ms (28-30 GB/s). A
// gather-GEMV's rows (an active list) skip ahead where neurons are off, which the hardware prefetcher cannot
// follow. The distance ramps up from the call's first tile, two tiles per tile computed, so a short call (an
// expert's slice, a 512-row K projection: a few dozen tiles) is covered from its start.
// `ahead`: the first row not yet prefetched (advanced here); `until`: prefetch no row at or past it.
template <int NR, typename RowOf>
inline void prefetch_rows_ahead(const MatMulArgs& a, RowOf row, int64_t& ahead, int64_t until) {
  for (int n = 0; n < 2 && ahead + NR <= until; ++n, ahead += NR)
    for (int i = 0; i < NR; ++i) {
      const char* p = reinterpret_cast<const char*>(a.row(row(ahead + i)));
      for (size_t off = 0; off < a.w_row_bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
    }
}

}  // namespace
}  // namespace pyinfer
