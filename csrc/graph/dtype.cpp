#include "graph/dtype.h"

namespace pyinfer {

// Every fact comes from kDTypeTraits (dtype.h).
bool dtype_is_integer_dot(DType t) { return dtype_traits(t) && dtype_traits(t)->integer_dot; }

bool dtype_is_quantized(DType t) { return dtype_traits(t) && dtype_traits(t)->quantized; }

int64_t dtype_block_elems(DType t) { return dtype_traits(t) ? dtype_traits(t)->block_elems : 1; }

bool dtype_is_known(DType t) { return dtype_traits(t) != nullptr; }

const char* dtype_name(DType t) { return dtype_traits(t) ? dtype_traits(t)->name : "?"; }

size_t dtype_row_bytes(DType t, int64_t n) {
  const DTypeTraits* r = dtype_traits(t);
  if (!r) return 0;
  return static_cast<size_t>(n / r->block_elems) * static_cast<size_t>(r->block_bytes);
}

}  // namespace pyinfer
