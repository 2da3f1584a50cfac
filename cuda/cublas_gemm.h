// cuBLAS for the dense matmuls of prefill (issue 12: "cuBLAS for dense F16 GEMM in prefill where it wins"):
// the activations and, a tile of rows at a time, the weight are converted to fp16 on the device, then
// cublasGemmEx with fp32 accumulation writes the F32 output. libcublas is opened at run time, so a CUDA build neither links nor
// needs it: where it cannot be loaded every matmul stays on the backend's own kernels.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "kernels/ops.cuh"

namespace pyinfer {

class PrefillGemm {
 public:
  // min_tokens: the fewest rows of x that go to cuBLAS (0: never). PYINFER_CUBLAS_MIN_TOKENS overrides.
  PrefillGemm(int device, int min_tokens);
  ~PrefillGemm();
  PrefillGemm(const PrefillGemm&) = delete;
  PrefillGemm& operator=(const PrefillGemm&) = delete;

  // Computes y = x @ w.T through cuBLAS when x has enough rows (never one), the library is there and its
  // scratch fits; false otherwise, y untouched (a failing cublasGemmEx turns cuBLAS off for good).
  bool run(const cuda::Rows& w, const cuda::Rows& x, const cuda::Rows& y, cudaStream_t s);
  // Why cuBLAS is not used ("" when it is): for `pyinfer info`-style reports and tests.
  const std::string& unavailable() const { return why_; }

 private:
  void* grow(void*& buf, size_t& have, size_t need);

  int device_, min_tokens_;
  void* handle_ = nullptr;  // cublasHandle_t
  std::string why_;
  void *w16_ = nullptr, *x16_ = nullptr;  // fp16 scratch: the weight, the activations
  size_t w16_bytes_ = 0, x16_bytes_ = 0;
};

}  // namespace pyinfer
