// Many-token integer-dot matmul on AMX int8 tiles (issue 28): the products are the same int8 x int8 sums the
// VNNI kernels form, 16 tokens x 16 weight rows x 32 elements per TDPBSSD, and the block scales are applied to
// each block's int32 tile as before (so nothing is re-quantized: lossless). Decode (one token) and the tails
// (under 16 tokens or rows) stay on the AVX-512 kernels.
//
// Layout. A tile (tmm0/1): 16 tokens x 32 bytes, read straight from the Q8A activation rows (the tile load
// takes their stride). B tile (tmm2/3): one weight block of 16 rows in the VNNI layout TDPBSSD wants,
// B[kk][4r + i] = q[r][4kk + i]: 8 rows of 64 bytes, packed here once per call from the GGUF blocks through
// the same piece decoders as the AVX-512 kernels (matmul_x86.h) and reused by every token tile. C tile
// (tmm4/5): C[t][r], 16 x 16 int32, stored to L1 and scaled into 16 float vectors, one per token, whose lanes
// are the 16 rows: each vector is 16 consecutive floats of dst.
//
// Q6_K's scales change every 16 elements, so its blocks are two K=16 halves: tokens' bytes 0..15 against B
// rows 0..3, bytes 16..31 against rows 4..7, each half scaled by its own d * sc.
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/amx_tiles.h"
#include "kernels/kernels.h"
#include "kernels/matmul_x86.h"

namespace pyinfer {
namespace {

constexpr int kAmxTile = 16;  // tokens per A tile, weight rows per B tile
enum : int { kTileA0 = 0, kTileA1 = 1, kTileB0 = 2, kTileB1 = 3, kTileC0 = 4, kTileC1 = 5 };

// One 32-element block of 16 weight rows: q in the VNNI layout, and per row the scale and offset of
// d * q + m (Q6_K: d * sc of elements 0..15 in d, of 16..31 in m).
struct alignas(64) PackedBlock {
  int8_t q[8][64];
  float d[16];
  float m[16];
};
static_assert(sizeof(PackedBlock) == 640, "8 x 64 bytes + 2 x 16 floats");

inline TileConfig amx_config(bool halves) {
  TileConfig c;
  for (int t : {kTileA0, kTileA1}) { c.rows[t] = kAmxTile; c.colsb[t] = halves ? 16 : 32; }
  for (int t : {kTileB0, kTileB1}) { c.rows[t] = halves ? 4 : 8; c.colsb[t] = 64; }
  for (int t : {kTileC0, kTileC1}) { c.rows[t] = kAmxTile; c.colsb[t] = 64; }
  return c;
}

// Rows first .. first + 15 of the call (indices into row_ids when set) into out[0 .. nb).
template <DType WT>
void pack_rows(const MatMulArgs& a, int64_t first, int64_t nb, PackedBlock* out) {
  using P = WeightBlock<WT>;
  for (int i = 0; i < kAmxTile; ++i) {
    const int64_t r = first + i;
    each_piece<P>(a.row(a.row_ids ? a.row_ids[r] : r), nb, [&](int64_t b, const Piece& p) {
      scatter_dwords(&out[b].q[0][4 * i], p.q);
      if constexpr (P::kSubScales) {
        out[b].d[i] = p.d * float(int16_t(_mm256_extract_epi16(p.sc16, 0)));
        out[b].m[i] = p.d * float(int16_t(_mm256_extract_epi16(p.sc16, 8)));
      } else {
        out[b].d[i] = p.d;
        out[b].m[i] = p.m;
      }
    });
  }
}

// acc[t] += C[t] (16 int32 at c + 16 t) * d * x_d(t); with the offset, also + m * x_s(t).
template <bool kOffset>
__attribute__((always_inline)) inline void scale_tile(const int32_t* c, const float* d, const float* m, const uint8_t* x, int64_t x_stride,
                       F16 (&acc)[kAmxTile]) {
  const F16 dv = f16_load(d);
  const F16 mv = f16_load(m);
#pragma GCC unroll 16
  for (int t = 0; t < kAmxTile; ++t) {
    const auto* xb = reinterpret_cast<const BlockQ8A*>(x + t * x_stride);
    acc[t] = f16_fma(f16_from_i32(c + 16 * t), f16_mul(dv, f16_set1(xb->d)), acc[t]);
    if constexpr (kOffset) acc[t] = f16_fma(mv, f16_set1(xb->s), acc[t]);
  }
}

// 16 tokens from x0 against the 16 packed rows `pk` (nb blocks): out[16 t + r] for token t, row r. The
// accumulators are locals so they stay in registers (through a caller's array they went to memory twice a row).
template <typename P>
void tile_tokens_amx(const PackedBlock* pk, int64_t nb, const uint8_t* x0, int64_t x_stride, float* out) {
  alignas(64) int32_t c0[kAmxTile * 16], c1[kAmxTile * 16];
  F16 acc[kAmxTile];
#pragma GCC unroll 16
  for (int t = 0; t < kAmxTile; ++t) acc[t] = f16_zero();
  constexpr size_t kQs = offsetof(BlockQ8A, qs);
  if constexpr (P::kSubScales) {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* xb = x0 + b * int64_t(sizeof(BlockQ8A));
      tile_zero<kTileC0>();
      tile_zero<kTileC1>();
      tile_load<kTileA0>(xb + kQs, x_stride);
      tile_load<kTileA1>(xb + kQs + 16, x_stride);
      tile_load<kTileB0>(pk[b].q[0], 64);
      tile_load<kTileB1>(pk[b].q[4], 64);
      tile_dpbssd<kTileC0, kTileA0, kTileB0>();
      tile_dpbssd<kTileC1, kTileA1, kTileB1>();
      tile_store<kTileC0>(c0, 64);
      tile_store<kTileC1>(c1, 64);
      scale_tile<false>(c0, pk[b].d, pk[b].d, xb, x_stride, acc);
      scale_tile<false>(c1, pk[b].m, pk[b].m, xb, x_stride, acc);
    }
  } else {
    // Two blocks a step in two C tiles: the second block's tile product can run while the first is scaled.
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      const uint8_t* xb = x0 + b * int64_t(sizeof(BlockQ8A));
      tile_zero<kTileC0>();
      tile_zero<kTileC1>();
      tile_load<kTileA0>(xb + kQs, x_stride);
      tile_load<kTileB0>(pk[b].q[0], 64);
      tile_dpbssd<kTileC0, kTileA0, kTileB0>();
      tile_load<kTileA1>(xb + sizeof(BlockQ8A) + kQs, x_stride);
      tile_load<kTileB1>(pk[b + 1].q[0], 64);
      tile_dpbssd<kTileC1, kTileA1, kTileB1>();
      tile_store<kTileC0>(c0, 64);
      scale_tile<P::kOffset>(c0, pk[b].d, pk[b].m, xb, x_stride, acc);
      tile_store<kTileC1>(c1, 64);
      scale_tile<P::kOffset>(c1, pk[b + 1].d, pk[b + 1].m, xb + sizeof(BlockQ8A), x_stride, acc);
    }
    if (b < nb) {
      const uint8_t* xb = x0 + b * int64_t(sizeof(BlockQ8A));
      tile_zero<kTileC0>();
      tile_load<kTileA0>(xb + kQs, x_stride);
      tile_load<kTileB0>(pk[b].q[0], 64);
      tile_dpbssd<kTileC0, kTileA0, kTileB0>();
      tile_store<kTileC0>(c0, 64);
      scale_tile<P::kOffset>(c0, pk[b].d, pk[b].m, xb, x_stride, acc);
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < kAmxTile; ++t) f16_store(out + 16 * t, acc[t]);
}

// The packed blocks of this thread (one buffer for every weight type).
inline std::vector<PackedBlock>& amx_scratch() {
  static thread_local std::vector<PackedBlock> packed;
  return packed;
}

// Rows [a.r0, r_end) (a multiple of 16 rows) x tokens [0, 16 * n_tiles).
template <DType WT>
void amx_rows(const MatMulArgs& a, int64_t r_end, int64_t n_tiles) {
  using P = WeightBlock<WT>;
  const int64_t nb = a.k / kQuantBlock;
  // Packed blocks of up to 256 KiB of rows stay in L2 while every token tile passes over them. Grown once per
  // thread (a model's widest row sets it), so steady prefill allocates nothing.
  constexpr int64_t kChunkBytes = 256 << 10;
  const int64_t groups_per_chunk = std::max<int64_t>(1, kChunkBytes / (nb * int64_t(sizeof(PackedBlock))));
  std::vector<PackedBlock>& packed = amx_scratch();
  if (int64_t(packed.size()) < groups_per_chunk * nb) packed.resize(size_t(groups_per_chunk * nb));
  tile_config(amx_config(P::kSubScales));
  const auto* x = static_cast<const uint8_t*>(a.x);
  const int64_t x_stride = int64_t(a.x_row_bytes);
  for (int64_t g0 = a.r0; g0 < r_end; g0 += groups_per_chunk * kAmxTile) {
    const int64_t g1 = std::min(r_end, g0 + groups_per_chunk * kAmxTile);
    for (int64_t g = g0; g < g1; g += kAmxTile) pack_rows<WT>(a, g, nb, packed.data() + (g - g0) / kAmxTile * nb);
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
      const int64_t t0 = tile * kAmxTile;
      for (int64_t g = g0; g < g1; g += kAmxTile) {
        alignas(64) float res[kAmxTile * 16];
        tile_tokens_amx<P>(packed.data() + (g - g0) / kAmxTile * nb, nb, x + t0 * x_stride, x_stride, res);
        for (int t = 0; t < kAmxTile; ++t) {
          float* out = a.dst + (t0 + t) * a.ldd;
          if (!a.row_ids)
            std::memcpy(out + g, res + 16 * t, sizeof(float) * kAmxTile);
          else
            for (int i = 0; i < kAmxTile; ++i) out[a.row_ids[g + i]] = res[16 * t + i];
        }
      }
    }
  }
  tile_release();
}

inline bool amx_type(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

// The AMX matmul: whole 16 x 16 tiles here, every other case (one token, float weights, the last rows and
// tokens that fill no tile) through `fallback`, which writes the same dst slots.
inline void matmul_amx(const MatMulArgs& a, void (*fallback)(const MatMulArgs&)) {
  const int64_t n_tiles = a.n_tok / kAmxTile;
  const int64_t r_end = a.r0 + (a.r1 - a.r0) / kAmxTile * kAmxTile;
  if (n_tiles == 0 || r_end == a.r0 || a.k < kQuantBlock || !amx_type(a.wtype)) return fallback(a);
  switch (a.wtype) {
    case DType::Q4_0: amx_rows<DType::Q4_0>(a, r_end, n_tiles); break;
    case DType::Q4_1: amx_rows<DType::Q4_1>(a, r_end, n_tiles); break;
    case DType::Q5_0: amx_rows<DType::Q5_0>(a, r_end, n_tiles); break;
    case DType::Q5_1: amx_rows<DType::Q5_1>(a, r_end, n_tiles); break;
    case DType::Q8_0: amx_rows<DType::Q8_0>(a, r_end, n_tiles); break;
    case DType::Q4_K: amx_rows<DType::Q4_K>(a, r_end, n_tiles); break;
    case DType::Q5_K: amx_rows<DType::Q5_K>(a, r_end, n_tiles); break;
    case DType::Q6_K: amx_rows<DType::Q6_K>(a, r_end, n_tiles); break;
    default: break;
  }
  if (r_end < a.r1) {  // the last rows, every token
    MatMulArgs rest = a;
    rest.r0 = r_end;
    fallback(rest);
  }
  const int64_t t_end = n_tiles * kAmxTile;
  if (t_end < a.n_tok) {  // the last tokens, the tiled rows
    MatMulArgs rest = a;
    rest.r1 = r_end;
    rest.x = static_cast<const uint8_t*>(a.x) + t_end * int64_t(a.x_row_bytes);
    rest.dst = a.dst + t_end * a.ldd;
    rest.n_tok = a.n_tok - t_end;
    fallback(rest);
  }
}

}  // namespace
}  // namespace pyinfer
