#include "graph/dtype.h"

namespace pyinfer {

bool dtype_is_integer_dot(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

bool dtype_is_quantized(DType t) { return dtype_is_integer_dot(t) || t == DType::Q8A || t == DType::Q4T; }

int64_t dtype_block_elems(DType t) {
  if (t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K) return kSuperBlock;
  return dtype_is_quantized(t) ? kQuantBlock : 1;
}

bool dtype_is_known(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::I32:
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::Q8A: case DType::Q4T:
      return true;
  }
  return false;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::Q4_0: return "Q4_0";
    case DType::Q4_1: return "Q4_1";
    case DType::Q5_0: return "Q5_0";
    case DType::Q5_1: return "Q5_1";
    case DType::Q8_0: return "Q8_0";
    case DType::Q4_K: return "Q4_K";
    case DType::Q5_K: return "Q5_K";
    case DType::Q6_K: return "Q6_K";
    case DType::Q8A: return "Q8A";
    case DType::Q4T: return "Q4T";
  }
  return "?";
}

size_t dtype_row_bytes(DType t, int64_t n) {
  const size_t blocks = static_cast<size_t>(n / kQuantBlock);
  const size_t supers = static_cast<size_t>(n / kSuperBlock);
  switch (t) {
    case DType::F32: case DType::I32: return static_cast<size_t>(n) * 4;
    case DType::F16: case DType::BF16: return static_cast<size_t>(n) * 2;
    case DType::Q4_0: return blocks * sizeof(BlockQ4_0);
    case DType::Q4_1: return blocks * sizeof(BlockQ4_1);
    case DType::Q5_0: return blocks * sizeof(BlockQ5_0);
    case DType::Q5_1: return blocks * sizeof(BlockQ5_1);
    case DType::Q8_0: return blocks * sizeof(BlockQ8_0);
    case DType::Q4_K: return supers * sizeof(BlockQ4_K);
    case DType::Q5_K: return supers * sizeof(BlockQ5_K);
    case DType::Q6_K: return supers * sizeof(BlockQ6_K);
    case DType::Q8A: return blocks * sizeof(BlockQ8A);
    case DType::Q4T: return blocks * 16;
  }
  return 0;
}

}  // namespace pyinfer
