// AVX-512 table: the AVX2 table with the integer-dot matmul rebuilt for AVX-512VL + VNNI (vpdpbusd for the
// byte dots, 32 vector registers for bigger tiles). Compiled alone with those flags; select_kernels()
// checks the CPU first. The prefill attention tile is 16-lane too (attention_avx512.cpp); every other entry is the
// AVX2 code, shared by pointer.
#if defined(__x86_64__) || defined(_M_X64)
#include "kernels/attention.h"
#include "kernels/kernels.h"
#include "kernels/matmul_x86.h"

namespace pyinfer {

const KernelTable* kernels_avx512() {
  static const KernelTable table = [] {
    KernelTable t = *kernels_avx2();
    t.isa = "avx512";
    // Prefill in tiles of 2 lane groups (16 rows) x 4 tokens: on a 2-core Zen 4 VM, 256 tokens against Q4_K 8960 x 1536
    // and 1536 x 8960 ran at 284 and 266 GMAC/s with 2 groups, 254 and 248 with 1, 265 and 200 with 3. Float weights
    // keep 4 rows x 4 tokens (of 4x4, 4x6, 6x4 and 8x2 the best or tied); decode 4 rows (matmul_x86.h's TileShape).
    t.matmul = matmul_x86<TileShape<2, 4, 4, 2>>;
    t.attn_tile = attn_tile_avx512;
    return t;
  }();
  return &table;
}

}  // namespace pyinfer
#else
#include "kernels/kernels.h"
namespace pyinfer {
const KernelTable* kernels_avx512() { return nullptr; }
}  // namespace pyinfer
#endif
