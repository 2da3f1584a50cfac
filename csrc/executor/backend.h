// The backend interface: a device that computes a run of graph nodes. The executor gives each
// backend its own driver thread when more than one has work, so a CPU and a GPU backend can
// compute their shares of one graph at the same time (PowerInfer's hybrid executor).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace pyinfer {

struct RunShape {
  int64_t n_tokens = 0;
  int64_t n_outputs = 0;
};

inline int64_t rows_in_run(const Tensor& t, const RunShape& s) {
  switch (t.row_mode) {
    case RowMode::Tokens: return s.n_tokens;
    case RowMode::Outputs: return s.n_outputs;
    default: return t.rows;
  }
}

// A backend computes nodes on memory of one space: 0 is host memory, which every CPU backend shares; a device
// (a GPU) has its own. The engine allocates each space's buffers through a backend of that space, uploads the
// weights its nodes read once, and inserts Copy nodes, computed by the device side, where a tensor crosses.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual bool supports(const Graph& graph, const Node& node) const = 0;
  virtual int memory_space() const { return 0; }
  // Zeroed memory of this backend's space, aligned to 64 bytes (std::bad_alloc when there is none left).
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p, size_t bytes) = 0;
  // Queues a copy between host memory and this backend's, either way; later work of this backend sees it.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Waits for every queued copy and computation; a failure in any of them is thrown here.
  virtual void synchronize() = 0;
  // Computes nodes in the given order. Inputs written by other backends are ready. Returns once the nodes'
  // results are visible to the other backends, or throws.
  virtual void compute(const Graph& graph, const std::vector<int>& nodes, const RunShape& shape) = 0;
};

}  // namespace pyinfer
