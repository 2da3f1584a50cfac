// Integer dot products of one 32-element weight block (a K-quant's sub-block) with one Q8A activation block,
// on the device: the CPU's integer-dot matmul (csrc/kernels/matmul_*.cpp) in dp4a form. The weight's integers
// meet the activation's int8 values four at a time; the block's scales are applied once, in float, to the
// integer sum, as the CPU applies them. A warp takes a row, each lane whole blocks: one pass over the row's
// bytes instead of one type switch and one scale read per element (weight_elem), which ran decode at about
// 20 GB/s on an H200.
#pragma once
#include <cstdint>

#include <cuda_fp16.h>

#include "kernels/common.cuh"
#include "kernels/dequant.cuh"

namespace pyinfer::cuda {

// The weight types with a block dot here; other types (F32, F16, BF16) take the element-wise matmul.
__host__ __device__ constexpr bool has_block_dot(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q8_0 ||
         t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || is_piece_type(t);
}

// Four bytes at a 2-byte-aligned address (blocks of 18, 22, 34 or 210 bytes align their fields to 2 only).
__device__ __forceinline__ uint32_t load4(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return uint32_t(h[0]) | uint32_t(h[1]) << 16;
}

// A Q8A block: float d, float s (= d * sum q), int8 q[32]; act4(xb, k) is q[4k .. 4k+3].
__device__ __forceinline__ int act4(const uint8_t* xb, int k) { return reinterpret_cast<const int*>(xb + 8)[k]; }
__device__ __forceinline__ float act_d(const uint8_t* xb) { return reinterpret_cast<const float*>(xb)[0]; }
__device__ __forceinline__ float act_s(const uint8_t* xb) { return reinterpret_cast<const float*>(xb)[1]; }

// Bits j..j+3 of h, each moved to bit 4 of its own byte (the fifth bits of four 5-bit values).
__device__ __forceinline__ uint32_t spread4(uint32_t h, int j) {
  const uint32_t b = (h >> j) & 0xfu;
  return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

// sum n_i q_i over a legacy block's 16 nibble bytes (low nibbles: elements 0..15, high: 16..31), with the
// fifth bits of qh when kFive.
template <bool kFive>
__device__ __forceinline__ int nibble_dot(const uint8_t* qs, uint32_t qh, const uint8_t* xb) {
  int sum = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t v = load4(qs + 4 * k);
    uint32_t lo = v & 0x0f0f0f0fu, hi = (v >> 4) & 0x0f0f0f0fu;
    if (kFive) {
      lo |= spread4(qh, 4 * k);
      hi |= spread4(qh, 16 + 4 * k);
    }
    sum = __dp4a(int(lo), act4(xb, k), sum);
    sum = __dp4a(int(hi), act4(xb, 4 + k), sum);
  }
  return sum;
}

// dot(weight block `blk` of row `row`, activation block xb): blk counts 32-element blocks along the row.
template <DType T>
__device__ __forceinline__ float block_dot(const uint8_t* row, int64_t blk, const uint8_t* xb) {
  if constexpr (T == DType::Q4_0) {  // w = d (n - 8)
    const uint8_t* b = row + blk * kQ4_0;
    return half_at(b) * (act_d(xb) * float(nibble_dot<false>(b + 2, 0, xb)) - 8.f * act_s(xb));
  } else if constexpr (T == DType::Q4_1) {  // w = d n + m
    const uint8_t* b = row + blk * kQ4_1;
    return half_at(b) * act_d(xb) * float(nibble_dot<false>(b + 4, 0, xb)) + half_at(b + 2) * act_s(xb);
  } else if constexpr (T == DType::Q5_0) {  // w = d (n5 - 16)
    const uint8_t* b = row + blk * kQ5_0;
    return half_at(b) * (act_d(xb) * float(nibble_dot<true>(b + 6, load4(b + 2), xb)) - 16.f * act_s(xb));
  } else if constexpr (T == DType::Q5_1) {  // w = d n5 + m
    const uint8_t* b = row + blk * kQ5_1;
    return half_at(b) * act_d(xb) * float(nibble_dot<true>(b + 8, load4(b + 4), xb)) + half_at(b + 2) * act_s(xb);
  } else if constexpr (T == DType::Q8_0) {  // w = d q
    const uint8_t* b = row + blk * kQ8_0;
    int sum = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) sum = __dp4a(int(load4(b + 2 + 4 * k)), act4(xb, k), sum);
    return half_at(b) * act_d(xb) * float(sum);
  } else if constexpr (T == DType::Q4_K || T == DType::Q5_K) {  // sub-block: w = d sc n - dmin mn
    constexpr bool five = T == DType::Q5_K;
    const int sub = int(blk % 8);
    const uint8_t* b = row + (blk / 8) * (five ? kQ5_K : kQ4_K);
    const uint8_t* qs = b + (five ? 48 : 16) + 32 * (sub / 2);
    const int shift = (sub & 1) * 4;
    int sum = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      uint32_t v = (load4(qs + 4 * k) >> shift) & 0x0f0f0f0fu;
      if (five) v |= ((load4(b + 16 + 4 * k) >> sub) & 0x01010101u) << 4;
      sum = __dp4a(int(v), act4(xb, k), sum);
    }
    int sc, mn;
    unpack_kquant_scale_min(b + 4, sub, sc, mn);
    return half_at(b) * float(sc) * act_d(xb) * float(sum) - half_at(b + 2) * float(mn) * act_s(xb);
  } else if constexpr (T == DType::Q6_K) {  // sub-block of two 16-element halves, each its own int8 scale
    const int sub = int(blk % 8), half = sub / 4, g = sub % 4;
    const uint8_t* b = row + (blk / 8) * kQ6_K;
    const uint8_t* ql = b + 64 * half + 32 * (g & 1);
    const uint8_t* qh = b + 128 + 32 * half;
    int sum[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t v = ((load4(ql + 4 * k) >> ((g >> 1) * 4)) & 0x0f0f0f0fu) |
                         (((load4(qh + 4 * k) >> (2 * g)) & 0x03030303u) << 4);
      sum[k / 4] = __dp4a(int(__vsub4(v, 0x20202020u)), act4(xb, k), sum[k / 4]);  // q - 32, byte by byte
    }
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * half + 2 * g);
    return half_at(b + 208) * act_d(xb) * float(int(sc[0]) * sum[0] + int(sc[1]) * sum[1]);
  } else if constexpr (is_piece_type(T)) {  // the CPU reference's piece, its two halves' scales in integers
    Piece32 p;
    decode_piece_with<DeviceTables>(T, row, blk, p);
    const int* q = reinterpret_cast<const int*>(p.q);
    int sum[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; ++k) sum[k / 4] = __dp4a(q[k], act4(xb, k), sum[k / 4]);
    const float dot = p.d * act_d(xb) * float(p.scale[0] * sum[0] + p.scale[1] * sum[1]);
    if constexpr (T == DType::Q2_K) {  // an offset per half: m x its min x the half's sum of x
      int half[2] = {0, 0};
#pragma unroll
      for (int k = 0; k < 8; ++k) half[k / 4] = __dp4a(0x01010101, act4(xb, k), half[k / 4]);
      return dot + p.m * act_d(xb) * float(p.mins[0] * half[0] + p.mins[1] * half[1]);
    }
    return dot + p.m * act_s(xb);
  } else {
    static_assert(has_block_dot(T), "no block dot for this weight type");
    return 0.f;
  }
}

// Warps per block of the block-dot matmuls: 128 threads, so a 576-row matrix still spreads over 144 blocks.
constexpr int kDotWarps = 4;

// y[t0 + t][row] = dot(weight row `row`, token t0 + t of x) for t < nt, by one warp: lanes take every 32nd
// block, then a warp sum. The dense and the gathered matmuls differ only in which row a warp takes.
template <DType T, int kTile>
__device__ __forceinline__ void warp_row_dot_q8a(const Rows& w, int64_t row, const Rows& x, int64_t t0, int nt,
                                                 const Rows& y) {
  const uint8_t* wr = w.data + row * w.stride;
  float acc[kTile] = {};
  for (int64_t blk = threadIdx.x % 32; blk < w.cols / kQuantBlock; blk += 32) {
#pragma unroll
    for (int t = 0; t < kTile; ++t)
      if (t < nt) acc[t] += block_dot<T>(wr, blk, x.data + (t0 + t) * x.stride + blk * kQ8A);
  }
#pragma unroll
  for (int t = 0; t < kTile; ++t) {
    if (t >= nt) break;
    const float v = warp_sum(acc[t]);
    if (threadIdx.x % 32 == 0) at<float>(y, t0 + t)[row] = v;
  }
}

// Switch cases over the types with a block dot: CALL(T) with T a constant DType (a template argument).
#define PYINFER_BLOCK_DOT_CASES(CALL)                 \
  case DType::Q4_0: CALL(DType::Q4_0); break;         \
  case DType::Q4_1: CALL(DType::Q4_1); break;         \
  case DType::Q5_0: CALL(DType::Q5_0); break;         \
  case DType::Q5_1: CALL(DType::Q5_1); break;         \
  case DType::Q8_0: CALL(DType::Q8_0); break;         \
  case DType::Q4_K: CALL(DType::Q4_K); break;         \
  case DType::Q5_K: CALL(DType::Q5_K); break;         \
  case DType::Q6_K: CALL(DType::Q6_K); break;         \
  case DType::Q2_K: CALL(DType::Q2_K); break;         \
  case DType::Q3_K: CALL(DType::Q3_K); break;         \
  case DType::IQ4_NL: CALL(DType::IQ4_NL); break;     \
  case DType::IQ4_XS: CALL(DType::IQ4_XS); break;     \
  case DType::MXFP4: CALL(DType::MXFP4); break;       \
  case DType::IQ2_XXS: CALL(DType::IQ2_XXS); break;   \
  case DType::IQ2_XS: CALL(DType::IQ2_XS); break;     \
  case DType::IQ2_S: CALL(DType::IQ2_S); break;       \
  case DType::IQ3_XXS: CALL(DType::IQ3_XXS); break;   \
  case DType::IQ3_S: CALL(DType::IQ3_S); break;

}  // namespace pyinfer::cuda
