// CUDA device query. The CUDA backend (neuron-aware kernels) builds on this in a later change.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace pyinfer {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  size_t total_memory = 0;
  int major = 0, minor = 0;
};

// Empty when no driver or device is present; never throws.
std::vector<CudaDeviceInfo> cuda_device_list();

}  // namespace pyinfer
