// PrefillGemm (cublas_gemm.h): libcublas opened with dlopen, the four entry points it needs declared here with
// the ABI of cublas_api.h (values of its enums as that header defines them), so no cuBLAS header or library
// is needed to build.
#include "cublas_gemm.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "cuda_backend.h"

namespace pyinfer {
namespace {

constexpr int kOpN = 0, kOpT = 1;         // cublasOperation_t
constexpr int kCompute32F = 68;           // cublasComputeType_t CUBLAS_COMPUTE_32F
constexpr int kGemmDefault = -1;          // cublasGemmAlgo_t CUBLAS_GEMM_DEFAULT
constexpr int64_t kScratchBytes = 16 << 20;  // the fp16 weight tile: 2048 rows of 4096

struct CublasApi {
  int (*create)(void** handle) = nullptr;
  int (*destroy)(void* handle) = nullptr;
  int (*set_stream)(void* handle, cudaStream_t s) = nullptr;
  int (*gemm_ex)(void* handle, int transa, int transb, int m, int n, int k, const void* alpha, const void* a,
                 cudaDataType a_type, int lda, const void* b, cudaDataType b_type, int ldb, const void* beta,
                 void* c, cudaDataType c_type, int ldc, int compute, int algo) = nullptr;
  std::string error;
};

// Loaded once per process: the newest library name that opens (PYINFER_CUBLAS names a file to try first).
const CublasApi& api() {
  static const CublasApi loaded = [] {
    CublasApi a;
    void* lib = nullptr;
    const char* own = std::getenv("PYINFER_CUBLAS");
    // The major version this build's runtime speaks first (a newer library can fail cublasCreate on an
    // older driver).
    const char* same = CUDART_VERSION >= 13000 ? "libcublas.so.13" : "libcublas.so.12";
    for (const char* name : {own, same, "libcublas.so.13", "libcublas.so.12", "libcublas.so"})
      if (name && (lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib) {
      a.error = "libcublas could not be opened";
      return a;
    }
    a.create = reinterpret_cast<decltype(a.create)>(dlsym(lib, "cublasCreate_v2"));
    a.destroy = reinterpret_cast<decltype(a.destroy)>(dlsym(lib, "cublasDestroy_v2"));
    a.set_stream = reinterpret_cast<decltype(a.set_stream)>(dlsym(lib, "cublasSetStream_v2"));
    a.gemm_ex = reinterpret_cast<decltype(a.gemm_ex)>(dlsym(lib, "cublasGemmEx"));
    if (!a.create || !a.destroy || !a.set_stream || !a.gemm_ex) a.error = "libcublas lacks cublasGemmEx";
    return a;
  }();
  return loaded;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

std::string cublas_error() { return api().error; }

PrefillGemm::PrefillGemm(int device, int min_tokens) : device_(device), min_tokens_(min_tokens) {
  if (const char* v = std::getenv("PYINFER_CUBLAS_MIN_TOKENS")) min_tokens_ = std::atoi(v);
  if (min_tokens_ <= 0) why_ = "turned off";
  // Never one token: those runs are captured into decode graphs, which must not allocate or hold this
  // scratch (it moves when a longer prompt grows it).
  min_tokens_ = min_tokens_ > 0 && min_tokens_ < 2 ? 2 : min_tokens_;
}

PrefillGemm::~PrefillGemm() {
  cudaSetDevice(device_);
  if (handle_) api().destroy(handle_);
  if (w16_) cudaFree(w16_);
  if (x16_) cudaFree(x16_);
}

void* PrefillGemm::grow(void*& buf, size_t& have, size_t need) {
  if (need > have) {  // prefill only: never inside a captured decode graph
    if (buf) check(cudaFree(buf), "cudaFree");
    buf = nullptr;
    have = 0;
    if (cudaMalloc(&buf, need) != cudaSuccess) {  // not in the placement's budget: the own kernel instead
      cudaGetLastError();
      buf = nullptr;
      return nullptr;
    }
    have = need;
  }
  return buf;
}

bool PrefillGemm::run(const cuda::Rows& w, const cuda::Rows& x, const cuda::Rows& y, cudaStream_t s) {
  if (min_tokens_ <= 0 || x.rows < min_tokens_ || y.type != DType::F32 || y.stride % 4) return false;
  if (w.rows > (1 << 30) || w.cols > (1 << 30) || x.rows > (1 << 30)) return false;
  if (!handle_) {
    if (!why_.empty()) return false;
    const CublasApi& a = api();
    if (!a.error.empty()) {
      why_ = a.error;
      return false;
    }
    if (a.create(&handle_) != 0) {
      handle_ = nullptr;
      why_ = "cublasCreate failed";
      return false;
    }
  }
  const CublasApi& a = api();
  // The weight goes to fp16 a tile of rows at a time: 16 MiB of scratch beside the placement's reserve, where
  // a whole head would take over a GiB the VRAM budget never counted.
  const int64_t tile = std::max<int64_t>(1, std::min<int64_t>(w.rows, kScratchBytes / 2 / std::max<int64_t>(w.cols, 1)));
  auto* w16 = static_cast<__half*>(grow(w16_, w16_bytes_, size_t(tile) * size_t(w.cols) * 2));
  auto* x16 = static_cast<__half*>(grow(x16_, x16_bytes_, size_t(x.rows) * size_t(x.cols) * 2));
  if (!w16 || !x16) return false;
  cuda::to_half(x, /*activation=*/true, x16, s);   // [x.rows, cols]
  if (a.set_stream(handle_, s) != 0) throw std::runtime_error("cublasSetStream failed");
  const float one = 1.f, zero = 0.f;
  for (int64_t r0 = 0; r0 < w.rows; r0 += tile) {
    const int64_t rows = std::min(tile, w.rows - r0);
    const cuda::Rows part{w.data + r0 * w.stride, rows, w.cols, w.stride, w.type};
    cuda::to_half(part, /*activation=*/false, w16, s);  // [rows, cols] fp16, packed; the stream orders reuse
    check(cudaGetLastError(), "the fp16 conversion for cuBLAS");
    // cuBLAS is column-major: the packed rows (row-major [rows, cols]) are A = [cols, rows] with lda = cols,
    // taken transposed; the packed activations are B = [cols, x.rows]; C = op(A) B is [rows, x.rows] with ldc
    // = y's row stride in floats, starting at column r0 of y: y[:, r0:r0+rows] = x @ part.T.
    const int st = a.gemm_ex(handle_, kOpT, kOpN, int(rows), int(x.rows), int(w.cols), &one, w16, CUDA_R_16F,
                             int(w.cols), x16, CUDA_R_16F, int(x.cols), &zero,
                             reinterpret_cast<float*>(y.data) + r0, CUDA_R_32F, int(y.stride / 4), kCompute32F,
                             kGemmDefault);
    if (st != 0) {  // e.g. not supported on this device: the own kernel rewrites all of y
      why_ = "cublasGemmEx returned " + std::to_string(st);
      api().destroy(handle_);
      handle_ = nullptr;
      return false;
    }
  }
  return true;
}

}  // namespace pyinfer
