#include "kernels/repack.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/attention.h"
#include "kernels/ops_float.h"

namespace pyinfer {

namespace {

// Runs f(begin, end) over [0, n) in up to `threads` contiguous chunks.
template <typename F>
void parallel_chunks(int64_t n, int threads, F f) {
  const int t = int(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  std::vector<std::thread> pool;
  for (int i = 1; i < t; ++i) pool.emplace_back(f, n * i / t, n * (i + 1) / t);
  f(0, n / t);
  for (auto& th : pool) th.join();
}

}  // namespace

void neuron_major(DType type, const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols,
                  const int32_t* perm, int64_t n, DType out, uint8_t* dst, int threads) {
  if (out != DType::F32 && out != DType::Q8_0) throw std::invalid_argument("neuron_major writes F32 or Q8_0");
  if (out == DType::Q8_0 && rows % kQuantBlock) throw std::invalid_argument("Q8_0 rows need a multiple of 32");
  for (int64_t k = 0; k < n; ++k)
    if (perm[k] < 0 || perm[k] >= cols) throw std::invalid_argument("permutation entry out of range");
  // 1. Every source row decoded: F32 [rows, cols].
  // Uninitialized (every element is written next): zeroing 2 x 180 MB for a 7B layer cost more than the work.
  std::unique_ptr<float[]> w(new float[size_t(rows) * size_t(cols)]);
  parallel_chunks(rows, threads, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) dequantize_row(type, src + r * src_stride, w.get() + r * cols, cols);
  });
  // 2. Transposed in 32 x 32 tiles (a column walk would miss the cache on every element): F32 [cols, rows].
  constexpr int64_t kTile = 32;
  std::unique_ptr<float[]> wt(new float[size_t(rows) * size_t(cols)]);
  parallel_chunks((cols + kTile - 1) / kTile, threads, [&](int64_t t0, int64_t t1) {
    const float* in = w.get();
    float* outp = wt.get();
    for (int64_t c0 = t0 * kTile; c0 < std::min(cols, t1 * kTile); c0 += kTile) {
      const int64_t c1 = std::min(cols, c0 + kTile);
      for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
        const int64_t r1 = std::min(rows, r0 + kTile);
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t r = r0; r < r1; ++r) outp[c * rows + r] = in[r * cols + c];
      }
    }
  });
  // 3. Neuron rows in the permuted order, quantized where asked.
  const size_t out_row = out == DType::F32 ? size_t(rows) * 4 : size_t(rows / kQuantBlock) * sizeof(BlockQ8_0);
  parallel_chunks(n, threads, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const float* col = wt.get() + size_t(perm[k]) * size_t(rows);
      uint8_t* o = dst + size_t(k) * out_row;
      if (out == DType::F32) std::memcpy(o, col, size_t(rows) * 4);
      else quantize_row_q8_0(col, reinterpret_cast<BlockQ8_0*>(o), rows);
    }
  });
}

}  // namespace pyinfer
