// Whether a node runs in this run: its RunIf, its token bounds and, for the two paths of a sparse FFN, the
// decision its ActiveUnion node wrote earlier in the same run. Every thread of a backend reads the same
// count after the barrier that follows the union, so they all agree.
#pragma once
#include <cstdint>

#include "graph/graph.h"

namespace pyinfer {

inline bool guard_passes(const Graph& g, const NodeGuard& guard, int64_t n_tokens) {
  if (guard.run_if != RunIf::Always && (guard.run_if == RunIf::SingleToken) != (n_tokens == 1)) return false;
  if (guard.max_tokens > 0 && n_tokens > guard.max_tokens) return false;
  if (guard.min_tokens > 0 && n_tokens < guard.min_tokens) return false;
  if (guard.when_list < 0) return true;
  return (*static_cast<const int32_t*>(g.tensors[size_t(guard.when_list)].data) >= 0) == guard.when_sparse;
}

}  // namespace pyinfer
