// The few AMX and 16-float operations the AMX matmul (matmul_amx.h) uses, in two forms: the real instructions
// (built with -mamx-tile -mamx-int8 -mavx512f, run only where dispatch.cpp found AMX and was granted the tile
// state), and, with PYINFER_AMX_EMULATE, the same semantics in portable code over AVX2, so the kernel's packing,
// indexing and scaling run against the scalar reference on any x86 CPU (tests/cpp/amx_emulated.cpp): CI has
// no AMX. Tile numbers are template arguments because the instructions take them as immediates.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace pyinfer {
namespace {

// LDTILECFG's 64-byte operand, palette 1: tile t has rows[t] rows of colsb[t] bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG operand");

#if defined(PYINFER_AMX_EMULATE)
// TDPBSSD's definition, on thread-local tiles: C[m][n] += sum_k A[m][k] * B[k / 4][4n + k % 4], int8 x int8
// into int32.
struct EmulatedTiles {
  TileConfig cfg;
  alignas(64) uint8_t data[8][16][64];
};
inline thread_local EmulatedTiles emu;

inline void tile_config(const TileConfig& c) { emu.cfg = c; }
inline void tile_release() {}
template <int T> inline void tile_zero() { std::memset(emu.data[T], 0, sizeof(emu.data[T])); }
template <int T> inline void tile_load(const void* p, int64_t stride) {
  for (int r = 0; r < emu.cfg.rows[T]; ++r)
    std::memcpy(emu.data[T][r], static_cast<const uint8_t*>(p) + r * stride, emu.cfg.colsb[T]);
}
template <int T> inline void tile_store(void* p, int64_t stride) {
  for (int r = 0; r < emu.cfg.rows[T]; ++r)
    std::memcpy(static_cast<uint8_t*>(p) + r * stride, emu.data[T][r], emu.cfg.colsb[T]);
}
template <int C, int A, int B> inline void tile_dpbssd() {
  // Per row m and 4-byte step kk: A's 4 bytes against B row kk (4 bytes for each of the 16 columns), as
  // maddubs takes them (unsigned x signed: B's sign moves onto A, since B (weights) may hold -128 and A (Q8A)
  // never does). Pairs fit int16: 128 x 127 x 2. Exact int32 sums, like the instruction.
  const int m_rows = emu.cfg.rows[A], k_steps = emu.cfg.colsb[A] / 4;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int m = 0; m < m_rows; ++m) {
    auto* c = reinterpret_cast<__m256i*>(emu.data[C][m]);
    __m256i c_lo = _mm256_loadu_si256(c), c_hi = _mm256_loadu_si256(c + 1);
    for (int kk = 0; kk < k_steps; ++kk) {
      int32_t a4;
      std::memcpy(&a4, &emu.data[A][m][4 * kk], 4);
      const __m256i a = _mm256_set1_epi32(a4);
      const auto* b = reinterpret_cast<const __m256i*>(emu.data[B][kk]);
      const __m256i b_lo = _mm256_loadu_si256(b), b_hi = _mm256_loadu_si256(b + 1);
      const __m256i p_lo = _mm256_maddubs_epi16(_mm256_sign_epi8(b_lo, b_lo), _mm256_sign_epi8(a, b_lo));
      const __m256i p_hi = _mm256_maddubs_epi16(_mm256_sign_epi8(b_hi, b_hi), _mm256_sign_epi8(a, b_hi));
      c_lo = _mm256_add_epi32(c_lo, _mm256_madd_epi16(p_lo, ones));
      c_hi = _mm256_add_epi32(c_hi, _mm256_madd_epi16(p_hi, ones));
    }
    _mm256_storeu_si256(c, c_lo);
    _mm256_storeu_si256(c + 1, c_hi);
  }
}

// 16 floats as two AVX2 vectors.
struct F16 { __m256 lo, hi; };
inline F16 f16_zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline F16 f16_load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline F16 f16_from_i32(const int32_t* p) {
  return {_mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
          _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 8)))};
}
inline F16 f16_set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline F16 f16_mul(F16 a, F16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline F16 f16_fma(F16 a, F16 b, F16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline void f16_store(float* p, F16 v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }

// The 8 dwords of q to p, p + 64, ..., p + 448 (a row's 32 bytes into a VNNI-layout B tile).
inline void scatter_dwords(int8_t* p, __m256i q) {
  alignas(32) int32_t d[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(d), q);
  for (int i = 0; i < 8; ++i) std::memcpy(p + 64 * i, &d[i], 4);
}
#else
inline void tile_config(const TileConfig& c) {
  asm volatile("" ::: "memory");  // the header declares 8 of the 64 bytes read
  _tile_loadconfig(&c);
}
inline void tile_release() { _tile_release(); }
// The compiler's tile macros paste their tile argument into the instruction text, so each tile number the
// kernel uses gets its own function.
template <int T> void tile_zero();
template <int T> void tile_load(const void* p, int64_t stride);
template <int T> void tile_store(void* p, int64_t stride);
template <int C, int A, int B> void tile_dpbssd();
// GCC's tile load tells the compiler of no memory it reads (register operands only), and older headers' tile
// store of none it writes: compiler barriers around them keep the packed blocks' stores before the loads and
// the int32 tile's store before the vector reads of it.
#define PYINFER_TILE(N)                                                                              \
  template <> inline void tile_zero<N>() { _tile_zero(N); }                                         \
  template <> inline void tile_load<N>(const void* p, int64_t stride) {                              \
    asm volatile("" ::: "memory");                                                                   \
    _tile_loadd(N, p, stride);                                                                       \
  }                                                                                                  \
  template <> inline void tile_store<N>(void* p, int64_t stride) {                                   \
    _tile_stored(N, p, stride);                                                                      \
    asm volatile("" ::: "memory");                                                                   \
  }
PYINFER_TILE(0)
PYINFER_TILE(1)
PYINFER_TILE(2)
PYINFER_TILE(3)
PYINFER_TILE(4)
PYINFER_TILE(5)
#undef PYINFER_TILE
template <> inline void tile_dpbssd<4, 0, 2>() { _tile_dpbssd(4, 0, 2); }
template <> inline void tile_dpbssd<5, 1, 3>() { _tile_dpbssd(5, 1, 3); }

using F16 = __m512;
inline F16 f16_zero() { return _mm512_setzero_ps(); }
inline F16 f16_load(const float* p) { return _mm512_loadu_ps(p); }
inline F16 f16_from_i32(const int32_t* p) { return _mm512_cvtepi32_ps(_mm512_loadu_si512(p)); }
inline F16 f16_set1(float x) { return _mm512_set1_ps(x); }
inline F16 f16_mul(F16 a, F16 b) { return _mm512_mul_ps(a, b); }
inline F16 f16_fma(F16 a, F16 b, F16 c) { return _mm512_fmadd_ps(a, b, c); }
inline void f16_store(float* p, F16 v) { _mm512_storeu_ps(p, v); }

inline void scatter_dwords(int8_t* p, __m256i q) {
  _mm256_i32scatter_epi32(p, _mm256_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448), q, 1);
}
#endif

}  // namespace
}  // namespace pyinfer
