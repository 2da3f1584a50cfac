// Element i of one row of any weight type pyinfer reads, on the device: the GGML block layouts of
// graph/dtype.h, decoded as csrc/kernels/quant_blocks.cpp decodes them on the CPU (the reference).
#pragma once
#include <cstdint>

#include <cuda_fp16.h>

#include "graph/dtype.h"
#include "kernels/iq_tables.h"
#include "kernels/kquant_scales.h"
#include "kernels/piece_decode.h"
#include "kernels/piece_types.cuh"

namespace pyinfer::cuda {

// Block sizes from the one type table (graph/dtype.h), as compile-time constants device code can use.
constexpr int kQ4_0 = dtype_block_bytes(DType::Q4_0), kQ4_1 = dtype_block_bytes(DType::Q4_1),
              kQ5_0 = dtype_block_bytes(DType::Q5_0), kQ5_1 = dtype_block_bytes(DType::Q5_1),
              kQ8_0 = dtype_block_bytes(DType::Q8_0), kQ4_K = dtype_block_bytes(DType::Q4_K),
              kQ5_K = dtype_block_bytes(DType::Q5_K), kQ6_K = dtype_block_bytes(DType::Q6_K),
              kQ8A = dtype_block_bytes(DType::Q8A);

// fp16 bits at a byte address (blocks of 18 or 22 bytes leave fields only 2-byte aligned).
__device__ __forceinline__ float half_at(const uint8_t* p) {
  const uint16_t bits = uint16_t(p[0]) | uint16_t(uint16_t(p[1]) << 8);
  return __half2float(__ushort_as_half(bits));
}

// Device copies of llama.cpp's value tables and grids (kernels/iq_tables.h), one per translation unit (static),
// for the low-bit types, which the device decodes with the CPU reference's own decoder (kernels/piece_decode.h).
struct Values16 { int8_t v[16]; };
constexpr Values16 values16(const int8_t (&a)[16]) {
  Values16 out{};
  for (int i = 0; i < 16; ++i) out.v[i] = a[i];
  return out;
}
static __device__ const Values16 kIq4ValuesDev = values16(kIq4Values);
static __device__ const Values16 kMxfp4ValuesDev = values16(kMxfp4Values);
static __device__ const IqSigns kIqSignsDev = kIqSigns;
static __device__ const IqGrid<256, 8> kIq2xxsGridDev = kIq2xxsGrid;
static __device__ const IqGrid<512, 8> kIq2xsGridDev = kIq2xsGrid;
static __device__ const IqGrid<1024, 8> kIq2sGridDev = kIq2sGrid;
static __device__ const IqGrid<256, 4> kIq3xxsGridDev = kIq3xxsGrid;
static __device__ const IqGrid<512, 4> kIq3sGridDev = kIq3sGrid;

struct DeviceTables {
  __device__ static float half(uint16_t h) { return __half2float(__ushort_as_half(h)); }
  __device__ static int8_t iq4(int i) { return kIq4ValuesDev.v[i]; }
  __device__ static int8_t mxfp4(int i) { return kMxfp4ValuesDev.v[i]; }
  __device__ static uint8_t signs(int i) { return kIqSignsDev.v[i]; }
  __device__ static const uint8_t* iq2xxs(int i) { return kIq2xxsGridDev.v[i]; }
  __device__ static const uint8_t* iq2xs(int i) { return kIq2xsGridDev.v[i]; }
  __device__ static const uint8_t* iq2s(int i) { return kIq2sGridDev.v[i]; }
  __device__ static const uint8_t* iq3xxs(int i) { return kIq3xxsGridDev.v[i]; }
  __device__ static const uint8_t* iq3s(int i) { return kIq3sGridDev.v[i]; }
};

// Element j of a decoded piece (quant_blocks.h: d scale[j / 16] q[j] + m, Q2_K's m per half times its min).
__device__ __forceinline__ float piece_elem(DType type, const Piece32& p, int j) {
  const float m = type == DType::Q2_K ? p.m * float(p.mins[j / 16]) : p.m;
  return p.d * float(p.scale[j / 16] * int(p.q[j])) + m;
}

// Low nibbles are elements 0..15 of a 32-element block, high nibbles 16..31.
__device__ __forceinline__ int nibble(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4; }

__device__ __forceinline__ int fifth_bit(const uint8_t* qh, int j) { return (qh[j / 8] >> (j % 8)) & 1; }

__device__ inline float weight_elem(DType type, const uint8_t* row, int64_t i) {
  const int j = int(i % 32);
  switch (type) {
    case DType::F32: return reinterpret_cast<const float*>(row)[i];
    case DType::F16: return half_at(row + 2 * i);
    case DType::BF16: {
      const uint32_t bits = uint32_t(row[2 * i]) << 16 | uint32_t(row[2 * i + 1]) << 24;
      return __uint_as_float(bits);
    }
    case DType::Q4_0: {
      const uint8_t* b = row + (i / kQuantBlock) * kQ4_0;
      return half_at(b) * float(nibble(b + 2, j) - 8);
    }
    case DType::Q4_1: {
      const uint8_t* b = row + (i / kQuantBlock) * kQ4_1;
      return half_at(b) * float(nibble(b + 4, j)) + half_at(b + 2);
    }
    case DType::Q5_0: {
      const uint8_t* b = row + (i / kQuantBlock) * kQ5_0;
      return half_at(b) * float((nibble(b + 6, j) | fifth_bit(b + 2, j) << 4) - 16);
    }
    case DType::Q5_1: {
      const uint8_t* b = row + (i / kQuantBlock) * kQ5_1;
      return half_at(b) * float(nibble(b + 8, j) | fifth_bit(b + 4, j) << 4) + half_at(b + 2);
    }
    case DType::Q8_0: {
      const uint8_t* b = row + (i / kQuantBlock) * kQ8_0;
      return half_at(b) * float(int8_t(b[2 + j]));
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      const bool five = type == DType::Q5_K;
      const uint8_t* b = row + (i / kSuperBlock) * (five ? kQ5_K : kQ4_K);
      const int e = int(i % 256), sub = e / 32, l = e % 32;
      const uint8_t* qs = b + (five ? 48 : 16);
      int v = (qs[32 * (sub / 2) + l] >> ((sub & 1) * 4)) & 0x0f;
      if (five) v |= ((b[16 + l] >> sub) & 1) << 4;
      int sc, mn;
      unpack_kquant_scale_min(b + 4, sub, sc, mn);
      return half_at(b) * float(sc * v) - half_at(b + 2) * float(mn);
    }
    case DType::Q6_K: {
      const uint8_t* b = row + (i / kSuperBlock) * kQ6_K;
      const int e = int(i % 256), sub = e / 32, l = e % 32, half = sub / 4, g = sub % 4;
      const uint8_t* ql = b + 64 * half + 32 * (g & 1);
      const uint8_t* qh = b + 128 + 32 * half;
      const int q = (((ql[l] >> ((g >> 1) * 4)) & 0x0f) | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
      const int scale = int(int8_t(b[192 + 8 * half + 2 * g + l / 16]));
      return half_at(b + 208) * float(scale * q);
    }
    default:
      if (is_piece_type(type)) {
        Piece32 p;
        decode_piece_with<DeviceTables>(type, row, i / kQuantBlock, p);
        return piece_elem(type, p, j);
      }
      return 0.f;
  }
}

// Element i of an activation row: F32, or Q8A blocks (float d, float s, int8 q[32]: x = d * q).
__device__ __forceinline__ float act_elem(DType type, const uint8_t* row, int64_t i) {
  if (type == DType::F32) return reinterpret_cast<const float*>(row)[i];
  const uint8_t* b = row + (i / kQuantBlock) * kQ8A;
  return *reinterpret_cast<const float*>(b) * float(int8_t(b[8 + i % 32]));
}

}  // namespace pyinfer::cuda
