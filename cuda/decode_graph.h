// CUDA graphs for decode steps (issue 12): a segment of a one-token run launches the same kernels with the
// same arguments at every position (positions, lists and tables are read on the device), so the backend
// records it once and replays it, one launch instead of one per node. Prefill and batches vary in shape and
// run node by node. PYINFER_CUDA_GRAPHS=0 turns replay off (to compare, or to rule it out).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "executor/backend.h"

namespace pyinfer {

// A copy to the device: its host rows are staged again before each replay, into the same pinned bytes.
struct Upload {
  const uint8_t* host;
  uint8_t* staged;
  int64_t rows, host_stride;
  size_t row_bytes;
};

// A copy to the host: the device writes the staging bytes, the host lands them after the run's sync.
struct Pending {
  uint8_t* host;
  const uint8_t* staged;
  int64_t rows, host_stride;
  size_t row_bytes;
};

class DecodeGraph {
 public:
  DecodeGraph() = default;
  DecodeGraph(const DecodeGraph&) = delete;
  DecodeGraph& operator=(const DecodeGraph&) = delete;
  ~DecodeGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
  }
  bool ready() const { return exec_ != nullptr; }
  // The first run sizes the staging buffer; the second is captured.
  bool should_capture() const { return !given_up_ && exec_ == nullptr && seen_ >= 2; }
  void seen() { seen_ = seen_ < 2 ? seen_ + 1 : 2; }
  void give_up() { given_up_ = true; }
  // Takes the captured graph (and destroys it once instantiated); on failure the slot gives up.
  void set(cudaGraph_t graph, std::vector<Upload> ups, std::vector<Pending> downs) {
    if (cudaGraphInstantiate(&exec_, graph, 0) != cudaSuccess) {
      exec_ = nullptr;
      given_up_ = true;
    }
    cudaGraphDestroy(graph);
    uploads = std::move(ups);
    pending = std::move(downs);
  }
  cudaError_t launch(cudaStream_t s) const { return cudaGraphLaunch(exec_, s); }

  std::vector<Upload> uploads;
  std::vector<Pending> pending;

 private:
  cudaGraphExec_t exec_ = nullptr;
  int seen_ = 0;
  bool given_up_ = false;
};

// One graph per segment (its node list) of one-token runs.
class DecodeGraphs {
 public:
  explicit DecodeGraphs(bool enabled) : enabled_(enabled) {}
  // The slot for this segment and shape, seen once more; nullptr where runs go node by node.
  // The executor's segments live as long as the engine, so a segment is known by its node list's address
  // (no copy of the list per step).
  DecodeGraph* find(const std::vector<int>& nodes, const RunShape& shape) {
    if (!enabled_ || shape.n_tokens != 1 || shape.n_outputs > 1 || nodes.empty()) return nullptr;
    DecodeGraph& g = slots_[Key{nodes.data(), nodes.size(), shape.n_outputs}];
    g.seen();
    return &g;
  }
  // Graphs point into the staging buffer: when it moves, every graph goes and is captured again.
  void clear() { slots_.clear(); }

 private:
  using Key = std::tuple<const int*, size_t, int64_t>;  // (segment's nodes, their count, outputs)
  bool enabled_;
  std::map<Key, DecodeGraph> slots_;
};

}  // namespace pyinfer
