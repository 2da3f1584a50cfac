// Launchers of the recurrent layers' kernels (kernels/recurrent.cu; csrc/kernels/recurrent.cpp is the reference).
// `state`: the state tensor's device rows (state_stride floats apart); `rows`: each token's state row, or null (row 0).
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "graph/op_params.h"
#include "kernels/ops.cuh"

namespace pyinfer::cuda {

void ssm_conv(const Rows& x, const Rows& weight, float* state, int64_t state_stride, const int32_t* positions,
              const int32_t* rows, const Rows& y, bool silu, cudaStream_t s);
// Whether the kernel takes this head size (one thread per state column, whole warps).
bool delta_net_fits(const DeltaNetParams& p);
void delta_net(const Rows& qkv, const Rows& beta, const Rows& alpha, const float* dt_bias, const float* a, float* state,
               int64_t state_stride, const int32_t* positions, const int32_t* rows, const Rows& out,
               const DeltaNetParams& p, cudaStream_t s);

}  // namespace pyinfer::cuda
