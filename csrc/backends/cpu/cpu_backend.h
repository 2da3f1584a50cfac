// CPU backend: every node is split across a persistent thread pool, with a barrier between nodes.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "executor/backend.h"
#include "executor/thread_pool.h"
#include "kernels/kernels.h"

namespace pyinfer {

class CpuBackend final : public Backend {
 public:
  // `isa`: "auto" or a name from available_isas(). Scratch is sized from the graph here,
  // so compute() allocates nothing.
  CpuBackend(const Graph& graph, int n_threads, const std::string& isa);
  std::string name() const override { return std::string("cpu-") + kernels_.isa; }
  bool supports(const Graph& graph, const Node& node) const override;
  void compute(const Graph& graph, const std::vector<int>& nodes, const RunShape& shape) override;

  int n_threads() const { return pool_.size(); }
  const char* isa() const { return kernels_.isa; }

 private:
  struct Job;
  static void run_job(void* job, int ith, int nth);
  void compute_node(const Graph& graph, const Node& node, const RunShape& shape, int ith, int nth);

  const KernelTable& kernels_;
  ThreadPool pool_;
  int64_t scratch_per_thread_ = 0;  // floats: attention scores over the longest KV cache
  std::vector<float> scratch_;
};

}  // namespace pyinfer
