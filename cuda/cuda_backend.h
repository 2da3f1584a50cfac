// The CUDA backend: one GPU behind the engine's Backend interface (executor/backend.h). Plain C++ (no CUDA
// headers), so the bindings can make one without being compiled by nvcc.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "executor/backend.h"

namespace pyinfer {

// A backend computing on GPU `device` in memory space `memory_space` (> 0). Throws std::runtime_error naming
// the CUDA error when the device cannot be used.
std::unique_ptr<Backend> make_cuda_backend(const Graph& graph, int device, int memory_space);

// What one split FFN layer costs on `device` beyond its compute: `bytes` copied up, `bytes` copied back and a
// stream synchronization (median seconds over `reps`). The GPU placement's communication constraint uses it.
double cuda_sync_seconds(int device, size_t bytes, int reps);

// Why prefill's matmuls cannot use cuBLAS in this process ("" when libcublas loads with what they need).
std::string cublas_error();

}  // namespace pyinfer
