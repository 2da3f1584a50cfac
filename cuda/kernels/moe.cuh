// Launchers of the Mixture-of-Experts kernels (kernels/moe.cu; csrc/backends/cpu/moe_ops.cpp is the reference).
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/ops.cuh"

namespace pyinfer::cuda {

// route F32 [T, 2k] = the top k experts of softmax or sigmoid(logits F32 [T, n_expert]), weights then ids.
// bias, expert_scale: F32 [n_expert] or null (kernels/moe_route_row.h)
void moe_route(const Rows& logits, const Rows& route, const MoeRouteParams& p, const float* bias,
               const float* expert_scale, cudaStream_t s);

struct MoeMatMulArgs {
  Rows w;             // merged experts [n_expert * rows_e, cols]
  Rows x;             // [T, cols] (gate, up) or [T, k * cols] with a segment per slot (down); F32 or Q8A
  Rows route;         // F32 [T, 2k]; no data: slot s runs expert s (k == n_expert, a matmul per head)
  Rows y;             // F32 [T, k * rows_e]
  bool per_slot;      // slot s reads x's segment s
  int64_t seg_bytes;  // one segment's bytes
  const float* gate;  // F32 [k * rows_e] of the one token, with `cut` F32 [n_expert, 3]; or null
  const float* cut;
  MoeParams p;
  int64_t pairs;      // set by the launcher: T * k
  Rows bias;          // F32 [n_expert, rows_e], each expert's own bias (gpt-oss); or no data
};
// y[t][s * rows_e + r] = dot(row r of expert route[t].id[s], x[t] or its segment s) (+ the expert's bias[r]); 0
// for another side's expert and, in a one-token run with a gate, for rows whose gate does not pass the expert's cut.
void moe_matmul(MoeMatMulArgs a, cudaStream_t s);
// y[t] = sum_s route[t].w[s] * experts[t][slot s] (+ sigmoid(shared_gate[t]) * shared[t]).
void moe_combine(const Rows& experts, const Rows& route, const Rows* shared, const Rows* shared_gate, const Rows& y,
                 int32_t k, cudaStream_t s);
// out = this side's share of a route: map I32 [n_route] -> local id or -1.
void moe_route_split(const Rows& route, const int32_t* map, int32_t n_route, int32_t n_local, const Rows& out,
                     int32_t k, cudaStream_t s);

}  // namespace pyinfer::cuda
