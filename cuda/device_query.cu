#include <cuda_runtime.h>

#include "cuda_info.h"

namespace pyinfer {

std::vector<CudaDeviceInfo> cuda_device_list() {
  std::vector<CudaDeviceInfo> out;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back(CudaDeviceInfo{i, p.name, p.totalGlobalMem, p.major, p.minor});
  }
  return out;
}

}  // namespace pyinfer
