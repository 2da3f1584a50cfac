// Where a tensor crosses memory spaces: the engine's graph rewrite that makes every node read tensors in its
// own backend's memory. ggml's backend scheduler does the same with its split inputs.
#pragma once
#include <utility>
#include <vector>

#include "graph/graph.h"

namespace pyinfer {

struct CopyPlan {
  // (mirror, weight): a weight read in another space gets a copy there, filled once when the engine is built.
  std::vector<std::pair<int, int>> uploads;
  // Per tensor: the tensor that holds its value in host memory once a run ends (itself when it lives there).
  std::vector<int> host_of;
  int copies = 0;  // Copy nodes inserted
};

// Rewrites the graph (and the per-node placement with it). Every tensor lives in one space: weights and inputs
// in host memory, the others where the first node that writes them runs; writes from another space are
// refused (GraphError). A node that reads a tensor living elsewhere reads a mirror in its own space, refreshed
// by a Copy node whenever the tensor was written since (the same mirror serves later readers); the logits and
// pinned tensors of a device get a host mirror at the end of the run. `space_of[b]`: backend b's memory space.
CopyPlan insert_copies(Graph& graph, std::vector<int>& placement, const std::vector<int>& space_of);

}  // namespace pyinfer
