// Portable fp16/bf16 <-> fp32 conversion (the scalar reference for every ISA path).
#pragma once
#include <cstdint>
#include <cstring>

namespace pyinfer {

inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 113;
      while (!(man & 0x400)) { man <<= 1; --exp; }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as F16C's _mm256_cvtps_ph(.., 0) does.
inline uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0);
  if (ax >= 0x477ff000u) return sign | 0x7c00;  // overflow to inf
  if (ax < 0x38800000u) {                        // subnormal or zero in fp16
    if (ax < 0x33000000u) return sign;
    const uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return sign | uint16_t(r);
  }
  uint32_t r = ax - 0x38000000u;  // rebias exponent 127 -> 15
  const uint32_t rem = r & 0x1fff;
  r >>= 13;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
  return sign | uint16_t(r);
}

inline float bf16_to_fp32(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace pyinfer
