// AMX table: the AVX-512 table whose many-token integer-dot matmul runs on AMX int8 tiles (matmul_amx.h).
// Compiled alone with the AMX and AVX-512 flags; select_kernels() checks the CPU and asks the kernel for the
// tile state first.
// PYINFER_AMX_EMULATE (a development build, CMakeLists.txt): the same kernel on emulated tiles, over the AVX2
// table, which gives the same bits as the AVX-512 one.
#if defined(PYINFER_AMX_EMULATE) || \
    ((defined(__x86_64__) || defined(_M_X64)) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__))
// GCC 12's own _mm512_cvtepi32_ps reads an uninitialized pass-through operand it never uses (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/matmul_amx.h"

namespace pyinfer {
namespace {
#if defined(PYINFER_AMX_EMULATE)
const KernelTable* base_table() { return kernels_avx2(); }
#else
const KernelTable* base_table() { return kernels_avx512(); }
#endif
void matmul_amx_or_base(const MatMulArgs& a) { matmul_amx(a, base_table()->matmul); }
}  // namespace

const KernelTable* kernels_amx() {
  static const KernelTable table = [] {
    KernelTable t = *base_table();
    t.isa = "amx";
    t.matmul = matmul_amx_or_base;
    return t;
  }();
  return &table;
}

}  // namespace pyinfer
#else
#include "kernels/kernels.h"
namespace pyinfer {
const KernelTable* kernels_amx() { return nullptr; }
}  // namespace pyinfer
#endif
