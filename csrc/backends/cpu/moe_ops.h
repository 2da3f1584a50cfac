// The CPU side of the Mixture-of-Experts ops (graph.h: MoeRoute, MoeMatMul, MoeCombine, MoeRouteSplit). Each function
// computes thread ith's share of one node; the backend puts a barrier after it.
#pragma once
#include <cstdint>

#include "executor/backend.h"
#include "kernels/kernels.h"

namespace pyinfer {

// Per-thread memory of MoeMatMul, sized by the backend at setup from the graph and the most tokens a run has.
struct MoeScratch {
  int32_t* order;   // [T * k]: (token * k + slot) grouped by expert
  int32_t* start;   // [n_expert + 1]: where each expert's group begins in `order`
  uint8_t* x;       // [T, one segment of x]: a group's inputs gathered into consecutive rows
  float* out;       // [T, rows_e]: a group's outputs before they are scattered to their tokens' slots
  int64_t rows;     // T: how many of a group's tokens x and out hold at once
  int32_t* ids;     // [rows_e]: a slot's rows that pass the gate's cut (MoeMatMul with `gate`)
};

// Sizes (per thread) MoeMatMul needs for a node in a run of at most max_tokens tokens.
struct MoeScratchSize {
  int64_t order = 0, start = 0, x_bytes = 0, out = 0, tokens = 0, ids = 0;
  void grow(const Graph& g, const Node& n, int64_t max_tokens);
};

void cpu_moe_route(const Graph& g, const Node& n, const RunShape& shape, int ith, int nth);
void cpu_moe_matmul(const KernelTable& k, const Graph& g, const Node& n, const RunShape& shape, int ith, int nth,
                    MoeScratch scratch);
void cpu_moe_combine(const Graph& g, const Node& n, const RunShape& shape, int ith, int nth);
void cpu_moe_route_split(const Graph& g, const Node& n, const RunShape& shape, int ith, int nth);

}  // namespace pyinfer
