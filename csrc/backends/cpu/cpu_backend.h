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
  // Wall time per op kind (seconds, node start to the barrier after it), accumulated while enabled.
  void set_op_timing(bool on) { op_timing_ = on; op_seconds_.assign(kOpKinds, 0.0); op_calls_.assign(kOpKinds, 0); }
  const std::vector<double>& op_seconds() const { return op_seconds_; }
  const std::vector<int64_t>& op_calls() const { return op_calls_; }
  static constexpr int kOpKinds = 16;
  const char* isa() const { return kernels_.isa; }

 private:
  struct Job;
  static void run_job(void* job, int ith, int nth);
  void compute_node(const Graph& graph, const Node& node, const RunShape& shape, int ith, int nth);

  const KernelTable& kernels_;
  ThreadPool pool_;
  int64_t scratch_per_thread_ = 0;  // floats: attention scores over the longest KV cache
  std::vector<float> scratch_;
  int64_t max_neurons_ = 0;  // n_ff. Per thread: kAxpyTokens lists of nonzero activations (down_axpy)
  std::vector<int32_t> neuron_ids_;
  std::vector<float> neuron_coef_;
  std::vector<float> neuron_dense_;
  int64_t max_width_ = 0;    // widest down output: Q4T group sums
  std::vector<float> group_tmp_;
  bool op_timing_ = false;
  std::vector<double> op_seconds_ = std::vector<double>(kOpKinds, 0.0);
  std::vector<int64_t> op_calls_ = std::vector<int64_t>(kOpKinds, 0);
};

}  // namespace pyinfer
