// NEON kernels against the scalar reference, cross-compiled for aarch64 and run under qemu-user
// (tests/test_neon_cross.py). Prints one line per check.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <random>
#include <vector>
#include "kernels/attention.h"
#include "kernels/kernels.h"
#include "kernels/fp16.h"
#include "random_blocks.h"
using namespace pyinfer;
static void sc_axpy(const AxpyRowsArgs& a) { kernels_scalar().axpy_rows(a); }
int main() {
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  const int k = 512, rows = 37, nt = 5;  // k: two K-quant super-blocks; nt: a 4-token tile and one more
  std::vector<float> x(nt * k); for (auto& v : x) v = nd(rng);
  const KernelTable* ne = kernels_neon(); const KernelTable& sc = kernels_scalar();
  std::vector<BlockQ8A> qa(nt * k / 32), qb(nt * k / 32);
  for (int t = 0; t < nt; ++t) { ne->quantize_q8a(&x[t*k], &qa[t*k/32], k); sc.quantize_q8a(&x[t*k], &qb[t*k/32], k); }
  int bad = 0;
  for (size_t i = 0; i < qa.size(); ++i) for (int j = 0; j < 32; ++j) bad += qa[i].qs[j] != qb[i].qs[j];
  printf("quantize mismatches %d\n", bad);
  {  // one scale per 256 (llama.cpp's Q8_K scheme)
    std::vector<BlockQ8A> ka(nt * k / 32), kb(nt * k / 32);
    for (int t = 0; t < nt; ++t) { ne->quantize_q8k(&x[t*k], &ka[t*k/32], k); sc.quantize_q8k(&x[t*k], &kb[t*k/32], k); }
    int kbad = 0;
    for (size_t i = 0; i < ka.size(); ++i) {
      kbad += ka[i].d != kb[i].d || ka[i].s != kb[i].s;
      for (int j = 0; j < 32; ++j) kbad += ka[i].qs[j] != kb[i].qs[j];
    }
    printf("q8k quantize mismatches %d\n", kbad);
    bad += kbad;
  }
  // Every integer-dot weight type has its own NEON piece decoder. Random bits, then sane fp16 scales where each
  // type keeps them.
  std::vector<DType> types(std::begin(kIntegerDotTypes), std::end(kIntegerDotTypes));
  types.insert(types.end(), std::begin(kLowBitTypes), std::end(kLowBitTypes));
  for (DType wt : types) {
    const size_t rb = dtype_row_bytes(wt, k);
    const auto w = random_rows(wt, rows, k, rng, [](int) { return 0.01f; });
    std::vector<float> ya(nt * rows), yb(nt * rows);
    MatMulArgs a{wt, w.data(), rb, k, 0, rows, qa.data(), dtype_row_bytes(DType::Q8A, k), nt, ya.data(), rows};
    ne->matmul(a); a.dst = yb.data(); sc.matmul(a);
    float md = 0, mx = 0;
    for (size_t i = 0; i < ya.size(); ++i) md = std::fmax(md, std::fabs(ya[i] - yb[i])), mx = std::fmax(mx, std::fabs(yb[i]));
    printf("%s max diff %g of %g\n", dtype_name(wt), md, mx);
  }
  for (DType wt : {DType::F32, DType::F16, DType::BF16}) {  // float weights; kf: no multiple of the 4-wide step
    const int kf = 70;
    const size_t rb = dtype_row_bytes(wt, kf);
    std::vector<uint8_t> w(rows * rb);
    for (int i = 0; i < rows * kf; ++i) {
      const float v = nd(rng);
      if (wt == DType::F32) memcpy(&w[size_t(i) * 4], &v, 4);
      uint32_t bits; memcpy(&bits, &v, 4);
      const uint16_t h = wt == DType::F16 ? fp32_to_fp16(v) : uint16_t(bits >> 16);
      if (wt != DType::F32) memcpy(&w[size_t(i) * 2], &h, 2);
    }
    std::vector<float> ya(nt * rows), yb(nt * rows);
    MatMulArgs a{wt, w.data(), rb, kf, 0, rows, x.data(), size_t(kf) * 4, nt, ya.data(), rows};
    ne->matmul(a); a.dst = yb.data(); sc.matmul(a);
    float md = 0, mx = 0;
    for (size_t i = 0; i < ya.size(); ++i) md = std::fmax(md, std::fabs(ya[i] - yb[i])), mx = std::fmax(mx, std::fabs(yb[i]));
    printf("float %s max diff %g of %g\n", dtype_name(wt), md, mx);
  }
  std::vector<uint16_t> h(64); std::vector<float> f(64), y1(64, 0), y2(64, 0);
  for (int i = 0; i < 64; ++i) { f[i] = nd(rng); h[i] = fp32_to_fp16(nd(rng)); }
  printf("dot diff %g\n", ne->dot_f16_f32(h.data(), f.data(), 64) - sc.dot_f16_f32(h.data(), f.data(), 64));
  std::vector<uint16_t> h1(64), h2(64); ne->f32_to_f16(f.data(), h1.data(), 64); sc.f32_to_f16(f.data(), h2.data(), 64);
  printf("f16 equal %d\n", int(h1 == h2));
  {  // SiLU(gate) * up: the same fused steps, so the same bits (203: a tail after the 4-lane loop)
    std::vector<float> g(203), u(203), s1(203), s2(203);
    for (int i = 0; i < 203; ++i) { g[i] = nd(rng) * 8; u[i] = nd(rng); }
    g[0] = -120.f; g[1] = 120.f; g[2] = 0.f; g[3] = -0.f;
    ne->silu_mul(g.data(), u.data(), s1.data(), 203); sc.silu_mul(g.data(), u.data(), s2.data(), 203);
    printf("silu equal %d\n", int(std::memcmp(s1.data(), s2.data(), sizeof(float) * 203) == 0));
  }
  {  // gather-GEMV over a row list equals the dense rows
    const DType wt = DType::Q4_1; const size_t rb = dtype_row_bytes(wt, k);
    std::vector<uint8_t> w(rows * rb); for (auto& b : w) b = rng() & 0xff;
    for (int r = 0; r < rows; ++r) for (int b = 0; b < k / 32; ++b) {
      uint16_t d = fp32_to_fp16(0.01f); memcpy(&w[r * rb + b * 20], &d, 2); memcpy(&w[r * rb + b * 20 + 2], &d, 2); }
    std::vector<int32_t> ids = {1, 4, 5, 9, 20, 36};
    std::vector<float> yd(rows, 0.f), yg(rows, 0.f);
    MatMulArgs a{wt, w.data(), rb, k, 0, rows, qa.data(), dtype_row_bytes(DType::Q8A, k), 1, yd.data(), rows};
    ne->matmul(a);
    a.r1 = int64_t(ids.size()); a.dst = yg.data(); a.row_ids = ids.data(); ne->matmul(a);
    float md = 0; for (int i : ids) md = std::fmax(md, std::fabs(yd[i] - yg[i]));
    printf("gather max diff %g\n", md);
  }
  for (DType wt : {DType::Q8_0, DType::Q4_1, DType::Q4T}) {  // neuron-major axpy
    const int n_ff = 64, d = 96;
    const size_t rb = dtype_row_bytes(wt, d);
    std::vector<uint8_t> w(n_ff * rb); for (auto& b : w) b = rng() & 0x7f;
    if (wt != DType::Q4T) for (int r = 0; r < n_ff; ++r) for (int b = 0; b < d / 32; ++b) {
      const size_t bb = rb / (d / 32); uint16_t s = fp32_to_fp16(0.02f);
      memcpy(&w[r * rb + b * bb], &s, 2); if (wt == DType::Q4_1) memcpy(&w[r * rb + b * bb + 2], &s, 2); }
    std::vector<uint16_t> sc(n_ff / 32 * 2 * d); for (auto& s : sc) s = fp32_to_fp16(nd(rng) * 0.1f);
    std::vector<int32_t> ids = {0, 3, 7, 8, 31, 33, 40, 41, 42, 63};
    std::vector<float> coef(ids.size()); for (auto& c : coef) c = nd(rng);
    std::vector<float> y1(d, 0.f), y2(d, 0.f);
    AxpyRowsArgs ax{wt, w.data(), rb, ids.data(), coef.data(), int64_t(ids.size()), 32, 96, y1.data()};
    ax.scales = sc.data(); ax.scales_stride = 2 * d;
    ne->axpy_rows(ax); ax.y = y2.data(); sc_axpy(ax);
    float md = 0; for (int i = 0; i < d; ++i) md = std::fmax(md, std::fabs(y1[i] - y2[i]));
    printf("axpy %s max diff %g\n", dtype_name(wt), md);
    if (wt == DType::Q4T) {  // the integer sums' worst case: full groups, equal coefficients, nibbles of 15
      std::fill(w.begin(), w.end(), uint8_t(0xff));
      std::vector<int32_t> all(n_ff); for (int i = 0; i < n_ff; ++i) all[i] = i;
      std::vector<float> ones(n_ff, 1.f);
      ax.ids = all.data(); ax.coef = ones.data(); ax.n = n_ff;
      std::fill(y1.begin(), y1.end(), 0.f); std::fill(y2.begin(), y2.end(), 0.f);
      ax.y = y1.data(); ne->axpy_rows(ax); ax.y = y2.data(); sc_axpy(ax);
      md = 0; for (int i = 0; i < d; ++i) md = std::fmax(md, std::fabs(y1[i] - y2[i]));
      printf("axpy Q4T full max diff %g\n", md);
    }
  }
  {  // the tiled attention: NEON's matrix-product tile and cache conversion against the scalar tile
    struct Case { const char* name; int heads, kv_heads, hd, depth, tokens, window; DType cache; bool inf_first; };
    const Case cases[] = {
        {"prefill", 6, 2, 64, 70, 70, 0, DType::F16, false},     // 126-row blocks, a partial last block
        {"decode", 6, 2, 64, 150, 1, 0, DType::F16, false},      // 3 rows: one row vector
        {"window", 3, 1, 32, 40, 40, 9, DType::F16, true},       // inf at key 0: only tokens that see it
        {"q8_0", 4, 1, 256, 33, 33, 0, DType::Q8_0, false},      // Gemma 3's head size
        {"hd24", 3, 3, 24, 20, 20, 0, DType::F16, false},        // value vectors past the 4-vector tile
    };
    for (const Case& c : cases) {
      const int width = c.kv_heads * c.hd, qw = c.heads * c.hd;
      const size_t row_bytes = c.cache == DType::Q8_0 ? size_t(width / 32) * sizeof(BlockQ8_0) : size_t(width) * 2;
      std::vector<uint8_t> kc(c.depth * row_bytes), vc(c.depth * row_bytes);
      std::vector<float> kv(width);
      for (int r = 0; r < c.depth; ++r)
        for (auto* cache : {&kc, &vc}) {
          for (auto& e : kv) e = nd(rng);
          if (cache == &vc && r == 0 && c.inf_first) std::fill(kv.begin(), kv.end(), 1e6f);  // beyond fp16
          uint8_t* dst = cache->data() + r * row_bytes;
          if (c.cache == DType::Q8_0) quantize_row_q8_0(kv.data(), reinterpret_cast<BlockQ8_0*>(dst), width);
          else sc.f32_to_f16(kv.data(), reinterpret_cast<uint16_t*>(dst), width);
        }
      std::vector<float> q(c.tokens * qw); for (auto& e : q) e = 2 * nd(rng);
      std::vector<int32_t> pos(c.tokens); for (int t = 0; t < c.tokens; ++t) pos[t] = c.depth - c.tokens + t;
      std::vector<float> oa(q.size()), ob(q.size());
      std::vector<float> ws(attention_thread_floats(c.heads, c.kv_heads, c.hd));
      AttentionArgs a;
      a.q = q.data(); a.q_stride = qw; a.k = kc.data(); a.v = vc.data(); a.k_type = a.v_type = c.cache;
      a.k_row_bytes = a.v_row_bytes = row_bytes; a.positions = pos.data(); a.n_tokens = c.tokens;
      a.heads = c.heads; a.kv_heads = c.kv_heads; a.head_dim = c.hd; a.window = c.window;
      a.scale = 1.f / std::sqrt(float(c.hd)); a.out_stride = qw;
      AttentionWorkspace w; w.thread = ws.data();
      a.out = oa.data(); attention(*ne, a, w, 0, 1);
      a.out = ob.data(); attention(sc, a, w, 0, 1);
      // tokens that see key 0 with the inf value: every engine gives them inf/NaN, so they are left out
      const int first = c.inf_first ? c.window : 0;
      float md = 0, mx = 0; int finite = 1;
      for (size_t i = size_t(first) * qw; i < oa.size(); ++i) {
        finite &= std::isfinite(oa[i]);
        md = std::fmax(md, std::fabs(oa[i] - ob[i])), mx = std::fmax(mx, std::fabs(ob[i]));
      }
      printf("attention %s max diff %g of %g finite %d\n", c.name, md, mx, finite);
    }
  }
  return 0;
}
