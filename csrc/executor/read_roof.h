// The machine's read bandwidth, measured the way decode reads weights: one buffer far larger than the caches,
// split into contiguous slices, one per thread of the engine's own pool, each summed front to back. The
// figure the kernel benchmarks compare a GEMV's bytes per second against (bench/test_bench_roof.py).
#pragma once
#include <cstddef>

namespace pyinfer {

// Best GB/s (1e9 bytes per second) of `repeats` full passes over a fresh buffer of `bytes` with `n_threads`.
double read_bandwidth_gbps(size_t bytes, int n_threads, int repeats);

}  // namespace pyinfer
