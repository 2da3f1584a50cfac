#include "kernels/quant_blocks.h"

#include "kernels/fp16.h"
#include "kernels/iq_tables.h"
#include "kernels/kquant_scales.h"

namespace pyinfer {

void kquant_scale_min(const uint8_t* scales, int j, int& scale, int& min) {
  unpack_kquant_scale_min(scales, j, scale, min);
}

namespace {

// The host's tables for the shared decoder (internal linkage: this file's instantiation alone).
struct HostTables {
  static float half(uint16_t h) { return fp16_to_fp32(h); }
  static int8_t iq4(int i) { return kIq4Values[i]; }
  static int8_t mxfp4(int i) { return kMxfp4Values[i]; }
  static uint8_t signs(int i) { return kIqSigns.v[i]; }
  static const uint8_t* iq2xxs(int i) { return kIq2xxsGrid.v[i]; }
  static const uint8_t* iq2xs(int i) { return kIq2xsGrid.v[i]; }
  static const uint8_t* iq2s(int i) { return kIq2sGrid.v[i]; }
  static const uint8_t* iq3xxs(int i) { return kIq3xxsGrid.v[i]; }
  static const uint8_t* iq3s(int i) { return kIq3sGrid.v[i]; }
};

}  // namespace

void decode_piece(DType type, const uint8_t* row, int64_t b, Piece32& p) { decode_piece_with<HostTables>(type, row, b, p); }

}  // namespace pyinfer
