#include "executor/read_roof.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "executor/thread_pool.h"

namespace pyinfer {
namespace {

struct Pass {
  const uint64_t* words;
  size_t n_words;
  uint64_t sums[64 * 8];  // one cache line a thread, so the result stores never share a line
};

// Four independent sums so the loop is bound by loads, not by one add chain; the compiler vectorises it with
// the baseline ISA (SSE2 here), which is enough: two 16-byte loads a cycle are far beyond any memory bus.
void sum_slice(void* ctx, int ith, int nth) {
  auto* p = static_cast<Pass*>(ctx);
  const size_t per = (p->n_words / size_t(nth)) & ~size_t(7);
  const size_t w0 = per * size_t(ith), w1 = ith == nth - 1 ? p->n_words : w0 + per;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = w0;
  for (; i + 4 <= w1; i += 4) {
    s0 += p->words[i];
    s1 += p->words[i + 1];
    s2 += p->words[i + 2];
    s3 += p->words[i + 3];
  }
  for (; i < w1; ++i) s0 += p->words[i];
  p->sums[size_t(ith) * 8 % (64 * 8)] = s0 + s1 + s2 + s3;
}

}  // namespace

double read_bandwidth_gbps(size_t bytes, int n_threads, int repeats) {
  if (bytes < (1u << 20) || n_threads < 1 || n_threads > 64 || repeats < 1)
    throw std::invalid_argument("read_bandwidth: bytes >= 1 MiB, 1 <= threads <= 64, repeats >= 1");
  const size_t n_words = bytes / sizeof(uint64_t);
  // On 2 MiB pages where the kernel grants them, as the weights the GEMVs are measured on (numpy's large arrays,
  // the model's read-in weights): on 4 KiB pages the TLB misses alone held two threads to 36 of 56 GB/s.
  constexpr size_t kHuge = size_t(2) << 20;
  const size_t alloc = (n_words * sizeof(uint64_t) + kHuge - 1) / kHuge * kHuge;
  std::unique_ptr<uint64_t, void (*)(void*)> buf(static_cast<uint64_t*>(std::aligned_alloc(kHuge, alloc)), std::free);
  if (!buf) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(buf.get(), alloc, MADV_HUGEPAGE);  // advice: refused where THP is off, and then 4 KiB pages
#endif
  for (size_t i = 0; i < n_words; ++i) buf.get()[i] = i;  // every page really mapped, and not all zero pages
  ThreadPool pool(n_threads);
  auto pass = std::make_unique<Pass>();
  pass->words = buf.get();
  pass->n_words = n_words;
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run(sum_slice, pass.get());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, double(n_words * sizeof(uint64_t)) / s / 1e9);
  }
  volatile uint64_t sink = pass->sums[0];  // the sums are used, so the loads are not dropped
  (void)sink;
  return best;
}

}  // namespace pyinfer
