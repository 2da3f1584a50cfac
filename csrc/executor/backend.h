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

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual bool supports(const Graph& graph, const Node& node) const = 0;
  // Computes nodes in the given order. Inputs written by other backends are ready.
  virtual void compute(const Graph& graph, const std::vector<int>& nodes, const RunShape& shape) = 0;
};

}  // namespace pyinfer
