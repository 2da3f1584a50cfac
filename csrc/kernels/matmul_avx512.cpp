// AVX-512 VNNI table: the AVX2 table with the integer-dot matmul rebuilt so vpdpbusd (256-bit, AVX512VL)
// replaces the maddubs + madd pair. Compiled alone with -mavx512f/bw/vl/vnni on top of the AVX2 flags;
// select_kernels() checks the CPU first. Everything else is the AVX2 code, shared by pointer.
#if defined(__x86_64__) || defined(_M_X64)
#include "kernels/kernels.h"
#include "kernels/matmul_x86_tiles.h"

namespace pyinfer {

const KernelTable* kernels_avx512_vnni() {
  static const KernelTable table = [] {
    KernelTable t = *kernels_avx2();
    t.isa = "avx512vnni";
    t.matmul = matmul_x86;
    return t;
  }();
  return &table;
}

}  // namespace pyinfer
#else
#include "kernels/kernels.h"
namespace pyinfer {
const KernelTable* kernels_avx512_vnni() { return nullptr; }
}  // namespace pyinfer
#endif
