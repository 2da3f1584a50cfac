// The AMX matmul (kernels/matmul_amx.h) with its tile instructions emulated (kernels/amx_tiles.h), against the
// scalar reference, on any x86 CPU with AVX2 (tests/test_amx.py builds and runs it): the packing into the VNNI
// layout, the tile indexing, the block scales and offsets, Q6_K's halves, the row and token tails and gathered
// rows all run here, since CI has no AMX. Prints one line per check.
// Built with -DPYINFER_AMX_REAL and the AMX flags on an AMX machine (bench/gpu/amx.sh), it runs the real
// instructions instead; the "bits" lines (a hash of each output's float bits) must then equal the emulated
// build's: the emulation is the hardware's arithmetic, so figures computed through it (perplexity on a machine
// without AMX, with cmake -DPYINFER_AMX_EMULATE=ON) are AMX's.
#if !defined(PYINFER_AMX_REAL)
#define PYINFER_AMX_EMULATE 1
#endif
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/fp16.h"
#include "kernels/matmul_amx.h"
#include "random_blocks.h"
#if defined(PYINFER_AMX_REAL)
#include <sys/syscall.h>
#include <unistd.h>
#endif

using namespace pyinfer;

static uint64_t bits_hash(const std::vector<float>& v) {  // FNV-1a over the floats' bytes
  uint64_t h = 1469598103934665603ull;
  for (float f : v) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    for (int i = 0; i < 4; ++i) h = (h ^ ((u >> (8 * i)) & 0xff)) * 1099511628211ull;
  }
  return h;
}

int main() {
#if defined(PYINFER_AMX_REAL)
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) {
    printf("no AMX tile state from the kernel\n");
    return 1;
  }
#endif
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const int k = 512, rows = 37, nt = 37;  // 2 row groups + 5 rows, 2 token tiles + 5 tokens; 2 K-quant super-blocks
  std::vector<float> x(size_t(nt) * k);
  for (auto& v : x) v = nd(rng);
  const KernelTable& sc = kernels_scalar();
  std::vector<BlockQ8A> qx(size_t(nt) * k / 32);
  for (int t = 0; t < nt; ++t) sc.quantize_q8a(&x[size_t(t) * k], &qx[size_t(t) * k / 32], k);
  const size_t x_row = dtype_row_bytes(DType::Q8A, k);
  for (DType wt : kIntegerDotTypes) {
    const size_t rb = dtype_row_bytes(wt, k);
    const auto w = random_rows(wt, rows, k, rng, [](int r) { return 0.01f * (1.f + 0.1f * float(r % 7)); });
    std::vector<float> ya(size_t(nt) * rows, NAN), yb(size_t(nt) * rows);
    MatMulArgs a{wt, w.data(), rb, k, 0, rows, qx.data(), x_row, nt, ya.data(), rows};
    matmul_amx(a, matmul_scalar);
    a.dst = yb.data();
    matmul_scalar(a);
    float md = 0, mx = 0;
    for (size_t i = 0; i < ya.size(); ++i)
      md = std::fmax(md, std::isnan(ya[i]) ? INFINITY : std::fabs(ya[i] - yb[i])), mx = std::fmax(mx, std::fabs(yb[i]));
    printf("%s max diff %g of %g\n", dtype_name(wt), md, mx);
    printf("%s bits %016llx\n", dtype_name(wt), static_cast<unsigned long long>(bits_hash(ya)));
  }
  {  // shapes the loop above does not reach: an odd block count (k = 96), rows past one packed chunk (k = 8192:
     // one 16-row group per chunk, 3 chunks), paged rows (w_rows), padded activation and output rows
    struct Shape { DType wt; int64_t k; int rows, n_tok; bool paged; size_t x_pad; int64_t ld_pad; };
    const Shape shapes[] = {{DType::Q4_0, 96, 32, 20, false, 0, 0}, {DType::Q5_1, 96, 19, 33, false, 0, 0},
                            {DType::Q8_0, 96, 16, 16, false, 0, 0}, {DType::Q4_K, 8192, 48, 17, false, 0, 0},
                            {DType::Q6_K, 8192, 40, 16, false, 0, 0}, {DType::Q4_1, 512, 35, 40, true, 0, 0},
                            {DType::Q5_0, 512, 33, 18, false, 40 * 3, 7}};
    for (const Shape& sh : shapes) {
      const size_t rb = dtype_row_bytes(sh.wt, sh.k);
      const auto w = random_rows(sh.wt, sh.rows, sh.k, rng, [](int r) { return 0.01f + 0.001f * float(r % 5); });
      std::vector<const uint8_t*> pages(size_t(sh.rows));
      for (int r = 0; r < sh.rows; ++r) pages[r] = w.data() + size_t(sh.rows - 1 - r) * rb;  // reversed
      const size_t xr = dtype_row_bytes(DType::Q8A, sh.k) + sh.x_pad;
      std::vector<uint8_t> xq(size_t(sh.n_tok) * xr);
      std::vector<float> xs(size_t(sh.k));
      for (int t = 0; t < sh.n_tok; ++t) {
        for (auto& v : xs) v = nd(rng);
        sc.quantize_q8a(xs.data(), reinterpret_cast<BlockQ8A*>(xq.data() + t * xr), sh.k);
      }
      const int64_t ld = sh.rows + sh.ld_pad;
      std::vector<float> ya(size_t(sh.n_tok) * ld, 0.f), yb(size_t(sh.n_tok) * ld, 0.f);
      MatMulArgs a{sh.wt, w.data(), rb, sh.k, 0, sh.rows, xq.data(), xr, sh.n_tok, ya.data(), ld};
      if (sh.paged) a.w_rows = pages.data();
      matmul_amx(a, matmul_scalar);
      a.dst = yb.data();
      matmul_scalar(a);
      float md = 0, mx = 0;
      for (size_t i = 0; i < ya.size(); ++i) md = std::fmax(md, std::fabs(ya[i] - yb[i])), mx = std::fmax(mx, std::fabs(yb[i]));
      printf("shape %s k=%lld rows=%d tokens=%d max diff %g of %g\n", dtype_name(sh.wt), static_cast<long long>(sh.k),
             sh.rows, sh.n_tok, md, mx);
    }
  }
  {  // gathered rows (row_ids) over a row range that starts inside the matrix, as a thread's share does
    const DType wt = DType::Q4_1;
    const size_t rb = dtype_row_bytes(wt, k);
    const int n_rows = 64;
    std::vector<uint8_t> w(size_t(n_rows) * rb);
    for (auto& b : w) b = uint8_t(rng() & 0xff);
    for (int r = 0; r < n_rows; ++r)
      for (int64_t b = 0; b < k / 32; ++b) {
        const uint16_t d = fp32_to_fp16(0.02f), m = fp32_to_fp16(-0.1f);
        std::memcpy(&w[r * rb + b * 20], &d, 2);
        std::memcpy(&w[r * rb + b * 20 + 2], &m, 2);
      }
    std::vector<int32_t> ids(40);
    for (int i = 0; i < 40; ++i) ids[i] = (i * 23 + 5) % n_rows;
    std::vector<float> ya(size_t(nt) * n_rows, 0.f), yb(size_t(nt) * n_rows, 0.f);
    MatMulArgs a{wt, w.data(), rb, k, 3, 40, qx.data(), x_row, nt, ya.data(), n_rows};
    a.row_ids = ids.data();
    matmul_amx(a, matmul_scalar);
    a.dst = yb.data();
    matmul_scalar(a);
    float md = 0;
    for (size_t i = 0; i < ya.size(); ++i) md = std::fmax(md, std::fabs(ya[i] - yb[i]));
    printf("gather max diff %g\n", md);
  }
  {  // integer sums exactly: Q8_0 weights with d = 1 against activations that quantize with d = 1
    const int kk = 64, n_rows = 16, n_tok = 16;
    std::vector<float> xi(size_t(n_tok) * kk);
    for (size_t i = 0; i < xi.size(); ++i) xi[i] = float(int(rng() % 255) - 127);
    for (int t = 0; t < n_tok; ++t)
      for (int b = 0; b < kk / 32; ++b) xi[size_t(t) * kk + b * 32] = 127.f;  // each block's max is 127: d = 1
    std::vector<BlockQ8A> qi(size_t(n_tok) * kk / 32);
    for (int t = 0; t < n_tok; ++t) sc.quantize_q8a(&xi[size_t(t) * kk], &qi[size_t(t) * kk / 32], kk);
    std::vector<BlockQ8_0> w(size_t(n_rows) * kk / 32);
    for (auto& blk : w) {
      blk.d = fp32_to_fp16(1.f);
      for (auto& q : blk.qs) q = int8_t(int(rng() % 256) - 128);  // -128 included: TDPBSSD is signed x signed
    }
    std::vector<float> ya(n_tok * n_rows), yb(n_tok * n_rows);
    MatMulArgs a{DType::Q8_0, reinterpret_cast<const uint8_t*>(w.data()), kk / 32 * sizeof(BlockQ8_0), kk, 0, n_rows,
                 qi.data(), dtype_row_bytes(DType::Q8A, kk), n_tok, ya.data(), n_rows};
    matmul_amx(a, matmul_scalar);
    a.dst = yb.data();
    matmul_scalar(a);
    int differ = 0;
    for (size_t i = 0; i < ya.size(); ++i) differ += ya[i] != yb[i];
    printf("integer sums differ %d of %zu\n", differ, ya.size());
  }
  return 0;
}
