// Prefill (two tokens or more) of the integer-dot types with weight rows as vector lanes, included by
// matmul_x86.h (one copy per kernel table, each with its ISA flags).
//
// A chunk of rows is decoded once into lane blocks: 8 rows' 32-element pieces interleaved four bytes at a time,
// so that one byte dot (vpdpbusd, or maddubs + madd on AVX2) of a lane block's dword column against a token's four
// activation bytes, broadcast, adds four products to each of 8 rows at once. A block's 8 dots leave each row's
// exact integer dot in its lane; the block's float work (convert, scale, accumulate, offset) is then one
// instruction per 8 rows instead of one per row and 4 elements (it was 3 of the 4 instructions per piece before:
// dot, convert, lane permute, FMA). Each lane sums exactly what decode's gemv_tile4 sums for its row, in the
// same order (acc = fma(float(int dot), d_w * d_x, acc) block after block, offsets in their own chain, added
// last), so a token gets the same bits alone and in a batch.
//
// Signed weights (Q8_0, Q6_K) take the activation as the unsigned operand: x + 128 (the token tile's bytes
// XORed with 0x80 once), and each lane block carries 128 * (sum of the row's weights) to subtract, which gives
// the same integer. AVX2 without VNNI cannot do that for Q8_0 (maddubs' pair sums of 255 * 128 overflow int16)
// and moves the weights' signs onto the activation instead.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/quant_blocks.h"

namespace pyinfer {
namespace {

constexpr int kLaneRows = 8;  // weight rows per lane block: the 32-bit lanes of one vector

// How a weight type is laid out in lane blocks.
enum class LaneKind {
  kUnsigned,   // q in 0..31 (Q4_0 .. Q5_1, Q4_K, Q5_K): weights are the unsigned operand, no correction
  kSigned,     // Q8_0 with VNNI: activation + 128 unsigned, one correction per row
  kSignFlip,   // Q8_0 without VNNI: |w| against sign(x, w)
  kHalves,     // Q6_K: activation + 128 unsigned, two halves of 16 each with their own scale and correction
};

template <typename P>
constexpr LaneKind lane_kind() {
  return P::kSubScales ? LaneKind::kHalves : !P::kSigned ? LaneKind::kUnsigned : kVnni ? LaneKind::kSigned
                                                                                       : LaneKind::kSignFlip;
}

// 8 rows x one 32-element block. ints[]: kSigned: [0] the corrections; kHalves: [0], [1] the scales of
// elements 0..15 and 16..31, [2] the correction of both, scaled.
template <int kInts>
struct alignas(32) LaneBlock {
  uint8_t q[8][32];  // q[i][4 r + e]: element 4 i + e of row r
  float d[8];        // the piece's d (d * sc for Q4_K/Q5_K)
  float m[8];        // the piece's offset
  int32_t ints[kInts][8];
};
template <>
struct alignas(32) LaneBlock<0> {
  uint8_t q[8][32];
  float d[8];
  float m[8];
};

template <LaneKind K>
constexpr int lane_ints() {
  return K == LaneKind::kHalves ? 3 : K == LaneKind::kSigned ? 1 : 0;
}

// Rows [c0, c1) of the call into lane blocks, group g (rows c0 + 8 g ..) at out + g * nb. A short last group
// repeats its last row; those lanes are computed and dropped.
template <typename P, LaneKind K, typename LB>
void decode_lane_rows(const MatMulArgs& a, int64_t c0, int64_t c1, int64_t nb, LB* out) {
  for (int64_t g0 = c0; g0 < c1; g0 += kLaneRows) {
    LB* blocks = out + (g0 - c0) / kLaneRows * nb;
    for (int r = 0; r < kLaneRows; ++r) {
      const int64_t i = g0 + r < c1 ? g0 + r : c1 - 1;
      each_piece<P>(a.row(a.row_ids ? a.row_ids[i] : i), nb, [&](int64_t b, const Piece& p) {
        alignas(32) int8_t q[32];
        _mm256_store_si256(reinterpret_cast<__m256i*>(q), p.q);
        LB& lb = blocks[b];
        for (int j = 0; j < 8; ++j) std::memcpy(&lb.q[j][4 * r], q + 4 * j, 4);
        lb.d[r] = p.d;
        lb.m[r] = p.m;
        if constexpr (K == LaneKind::kSigned || K == LaneKind::kHalves) {
          int32_t sum[2] = {0, 0};
          for (int e = 0; e < 32; ++e) sum[e / 16] += q[e];
          if constexpr (K == LaneKind::kSigned) {
            lb.ints[0][r] = 128 * (sum[0] + sum[1]);
          } else {
            const int32_t sc0 = int16_t(_mm256_extract_epi16(p.sc16, 0)), sc1 = int16_t(_mm256_extract_epi16(p.sc16, 8));
            lb.ints[0][r] = sc0;
            lb.ints[1][r] = sc1;
            lb.ints[2][r] = 128 * (sc0 * sum[0] + sc1 * sum[1]);
          }
        }
      });
    }
  }
}

inline __m256i broadcast_dword(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// NG lane groups (8 rows each) x NT tokens over all nb blocks. `xq[t]`: token t's activation bytes of block b at
// xq[t] + b * xq_stride (the Q8A blocks themselves, or their + 128 copy for signed weights); `xb[t]`: its Q8A
// blocks (scales). res[g][t]: lane r is row 8 g + r.
template <bool kOffset, LaneKind K, typename LB, int NG, int NT>
inline void lane_tile(const LB* const* groups, const uint8_t* const* xq, int64_t xq_stride, const BlockQ8A* const* xb,
                      int64_t nb, __m256 (&res)[NG][NT]) {
  __m256 acc[NG][NT], off[NG][NT];
  for (int g = 0; g < NG; ++g)
    for (int t = 0; t < NT; ++t) acc[g][t] = off[g][t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i dot[NG][NT], part[NG][NT];  // part: Q6_K's first half, times its scale
    for (int g = 0; g < NG; ++g)
      for (int t = 0; t < NT; ++t) dot[g][t] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      if constexpr (K == LaneKind::kHalves)
        if (i == 4)
          for (int g = 0; g < NG; ++g) {
            const __m256i sc0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(groups[g][b].ints[0]));
            for (int t = 0; t < NT; ++t) {
              part[g][t] = _mm256_mullo_epi32(dot[g][t], sc0);
              dot[g][t] = _mm256_setzero_si256();
            }
          }
      __m256i w[NG];
      for (int g = 0; g < NG; ++g) w[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(groups[g][b].q[i]));
      for (int t = 0; t < NT; ++t) {
        const __m256i x = broadcast_dword(xq[t] + b * xq_stride + 4 * i);
        for (int g = 0; g < NG; ++g) {
          if constexpr (K == LaneKind::kUnsigned)
            dot[g][t] = dot4(dot[g][t], w[g], x);
          else if constexpr (K == LaneKind::kSignFlip)
            dot[g][t] = dot4(dot[g][t], _mm256_sign_epi8(w[g], w[g]), _mm256_sign_epi8(x, w[g]));
          else
            dot[g][t] = dot4(dot[g][t], x, w[g]);
        }
      }
    }
    for (int g = 0; g < NG; ++g) {
      const LB& lb = groups[g][b];
      const __m256 d = _mm256_load_ps(lb.d);
      for (int t = 0; t < NT; ++t) {
        __m256i n = dot[g][t];
        if constexpr (K == LaneKind::kSigned) {
          n = _mm256_sub_epi32(n, _mm256_load_si256(reinterpret_cast<const __m256i*>(lb.ints[0])));
        } else if constexpr (K == LaneKind::kHalves) {
          const auto* v = reinterpret_cast<const __m256i*>(lb.ints);
          n = _mm256_sub_epi32(_mm256_add_epi32(part[g][t], _mm256_mullo_epi32(n, _mm256_load_si256(v + 1))),
                               _mm256_load_si256(v + 2));
        }
        acc[g][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(n), _mm256_mul_ps(d, _mm256_broadcast_ss(&xb[t][b].d)), acc[g][t]);
        if constexpr (kOffset)
          off[g][t] = _mm256_fmadd_ps(_mm256_load_ps(lb.m), _mm256_broadcast_ss(&xb[t][b].s), off[g][t]);
      }
    }
  }
  for (int g = 0; g < NG; ++g)
    for (int t = 0; t < NT; ++t) res[g][t] = _mm256_add_ps(acc[g][t], off[g][t]);
}

// Tokens [t0, t0 + NT) against the decoded rows [c0, c1) (lane groups at `chunk`), written to dst. `xcopy`: for
// signed weights, every token's activation bytes + 128, nb * 32 bytes a token.
template <typename P, LaneKind K, typename LB, int NG, int NT>
void lane_tokens(const MatMulArgs& a, const LB* chunk, int64_t c0, int64_t c1, int64_t nb, int64_t t0,
                 const uint8_t* xcopy) {
  constexpr bool kCopy = K == LaneKind::kSigned || K == LaneKind::kHalves;
  const BlockQ8A* xb[NT];
  const uint8_t* xq[NT];
  for (int t = 0; t < NT; ++t) {
    xb[t] = reinterpret_cast<const BlockQ8A*>(static_cast<const uint8_t*>(a.x) + (t0 + t) * a.x_row_bytes);
    xq[t] = kCopy ? xcopy + (t0 + t) * nb * 32 : reinterpret_cast<const uint8_t*>(xb[t]) + offsetof(BlockQ8A, qs);
  }
  const int64_t xq_stride = kCopy ? 32 : int64_t(sizeof(BlockQ8A));
  const int64_t groups = (c1 - c0 + kLaneRows - 1) / kLaneRows;
  for (int64_t g = 0; g < groups; g += NG) {
    const int ng = int(groups - g < NG ? groups - g : NG);
    const LB* gp[NG];
    for (int i = 0; i < NG; ++i) gp[i] = chunk + (g + (i < ng ? i : ng - 1)) * nb;  // a short tile repeats a group
    __m256 res[NG][NT];
    lane_tile<P::kOffset, K, LB, NG, NT>(gp, xq, xq_stride, xb, nb, res);
    for (int i = 0; i < ng; ++i) {
      const int64_t r0 = c0 + (g + i) * kLaneRows;
      const int nr = int(c1 - r0 < kLaneRows ? c1 - r0 : kLaneRows);
      for (int t = 0; t < NT; ++t) {
        float* out = a.dst + (t0 + t) * a.ldd;
        if (!a.row_ids && nr == kLaneRows) {
          _mm256_storeu_ps(out + r0, res[i][t]);
        } else {
          alignas(32) float v[8];
          _mm256_store_ps(v, res[i][t]);
          for (int r = 0; r < nr; ++r) out[a.row_ids ? a.row_ids[r0 + r] : r0 + r] = v[r];
        }
      }
    }
  }
}

// A thread's buffers, grown to the widest call it has seen (so steady prefill allocates nothing): the decoded lane
// blocks of a row chunk, and the + 128 copy of the activations for signed weights.
struct LaneScratch {
  std::vector<uint8_t> chunk, xcopy;
};
inline LaneScratch& lane_scratch() {
  static thread_local LaneScratch s;
  return s;
}

// Bytes of decoded lane blocks per row chunk (within L2) that every token tile passes over.
constexpr int64_t kLaneChunkBytes = 256 << 10;

// Prefill of rows [a.r0, a.r1) for all a.n_tok tokens, in row chunks of up to 64 rows (fewer for long rows: at
// least one tile of NG lane groups whatever the length).
template <DType WT, int NG, int NT>
void matmul_lanes(const MatMulArgs& a) {
  using P = WeightBlock<WT>;
  constexpr LaneKind K = lane_kind<P>();
  static_assert(NT >= 1 && NT <= 4, "token tails of 1..3");
  using LB = LaneBlock<lane_ints<K>()>;
  const int64_t nb = a.k / kQuantBlock;
  const int64_t group_bytes = nb * int64_t(sizeof(LB));
  // Whole tiles of NG groups (a short tile computes a repeated group and drops it: a chunk of 3 groups in tiles of 2
  // ran Llama-3.2-3B's ffn_down at 224 GMAC/s against 290 for its neighbours), at least one tile however long the
  // rows.
  int64_t groups = kLaneChunkBytes / group_bytes / NG * NG;
  groups = groups < NG ? NG : groups > 8 ? 8 : groups;
  const int64_t rows = groups * kLaneRows;
  LaneScratch& scratch = lane_scratch();
  if (int64_t(scratch.chunk.size()) < groups * group_bytes + 32) scratch.chunk.resize(size_t(groups * group_bytes + 32));
  LB* chunk = reinterpret_cast<LB*>((reinterpret_cast<uintptr_t>(scratch.chunk.data()) + 31) & ~uintptr_t(31));
  // Signed weights read the activation + 128, copied once per slab of tokens: slabs bound the copy (4 MiB a thread
  // at 256 tokens of 16,384 elements) at the price of decoding the weights once more per slab.
  constexpr bool kCopy = K == LaneKind::kSigned || K == LaneKind::kHalves;
  const int64_t slab = kCopy && a.n_tok > 256 ? 256 : a.n_tok;
  if (kCopy && int64_t(scratch.xcopy.size()) < slab * nb * 32) scratch.xcopy.resize(size_t(slab * nb * 32));
  for (int64_t s0 = 0; s0 < a.n_tok; s0 += slab) {
    MatMulArgs part = a;  // this slab's tokens
    part.n_tok = s0 + slab < a.n_tok ? slab : a.n_tok - s0;
    part.x = static_cast<const uint8_t*>(a.x) + s0 * int64_t(a.x_row_bytes);
    part.dst = a.dst + s0 * a.ldd;
    const uint8_t* xcopy = nullptr;
    if constexpr (kCopy) {
      const __m256i flip = _mm256_set1_epi8(char(0x80));
      for (int64_t t = 0; t < part.n_tok; ++t) {
        const auto* x = reinterpret_cast<const BlockQ8A*>(static_cast<const uint8_t*>(part.x) + t * part.x_row_bytes);
        uint8_t* out = scratch.xcopy.data() + t * nb * 32;
        for (int64_t b = 0; b < nb; ++b)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * b),
                              _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs)), flip));
      }
      xcopy = scratch.xcopy.data();
    }
    for (int64_t c0 = part.r0; c0 < part.r1; c0 += rows) {
      const int64_t c1 = c0 + rows < part.r1 ? c0 + rows : part.r1;
      decode_lane_rows<P, K, LB>(part, c0, c1, nb, chunk);
      int64_t t = 0;
      for (; t + NT <= part.n_tok; t += NT) lane_tokens<P, K, LB, NG, NT>(part, chunk, c0, c1, nb, t, xcopy);
      switch (part.n_tok - t) {
        case 3: if constexpr (NT > 3) lane_tokens<P, K, LB, NG, 3>(part, chunk, c0, c1, nb, t, xcopy); break;
        case 2: if constexpr (NT > 2) lane_tokens<P, K, LB, NG, 2>(part, chunk, c0, c1, nb, t, xcopy); break;
        case 1: lane_tokens<P, K, LB, NG, 1>(part, chunk, c0, c1, nb, t, xcopy); break;
        default: break;
      }
    }
  }
}

}  // namespace
}  // namespace pyinfer
