// CPU backend: every node is split across a persistent thread pool, with a barrier between nodes.
#pragma once
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "executor/backend.h"
#include "backends/cpu/moe_ops.h"
#include "executor/thread_pool.h"
#include "kernels/kernels.h"
#include "offload/expert_store.h"
#include "offload/neuron_store.h"

namespace pyinfer {

class CpuBackend final : public Backend {
 public:
  // `isa`: "auto" or a name from available_isas(). Scratch is sized from the graph here,
  // so compute() allocates nothing.
  // `memory_space` > 0 makes it a stand-in for a device: the engine gives it buffers of its own and copies
  // tensors in and out as it would for a GPU (the same host RAM underneath), so that path is tested on CPU.
  // `max_tokens`: the most tokens a run has (sizes the Mixture-of-Experts grouping scratch).
  CpuBackend(const Graph& graph, int n_threads, const std::string& isa, int memory_space = 0, int64_t max_tokens = 1);
  std::string name() const override { return std::string("cpu-") + kernels_.isa; }
  bool supports(const Graph& graph, const Node& node) const override;
  int memory_space() const override { return memory_space_; }
  void* alloc(size_t bytes) override;
  void release(void* p, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void synchronize() override {}
  // An exception on any pool thread stops every thread after the node it is in (they all meet at the
  // barrier), and the first one is rethrown here, on the caller's thread.
  void compute(const Graph& graph, const std::vector<int>& nodes, const RunShape& shape) override;
  // Tests: node `node` throws on pool thread `thread` (-1: never), to check that errors come back.
  void inject_fault(int node, int thread) { fault_node_ = node; fault_thread_ = thread; }

  int n_threads() const { return pool_.size(); }
  // Wall time per op kind and per node (seconds, node start to the barrier after it), accumulated while
  // enabled. Per node, so a caller can sum a layer's FFN (sparsity/auto_choice.py weighs it per layer).
  void set_op_timing(bool on) {
    op_timing_ = on;
    op_seconds_.assign(kOpKinds, 0.0);
    op_calls_.assign(kOpKinds, 0);
    node_seconds_.assign(node_seconds_.size(), 0.0);
  }
  const std::vector<double>& op_seconds() const { return op_seconds_; }
  const std::vector<double>& node_seconds() const { return node_seconds_; }  // [graph nodes seen while timed]
  const std::vector<int64_t>& op_calls() const { return op_calls_; }
  const char* isa() const { return kernels_.isa; }
  // Where NeuronFetch nodes fetch from (the engine's; not owned).
  void set_neuron_store(NeuronStore* store) { store_ = store; }
  // Where ExpertFetch nodes fetch from (the engine's; not owned).
  void set_expert_store(ExpertStore* store) { experts_ = store; }

 private:
  struct Job;
  static void run_job(void* job, int ith, int nth);
  void compute_node(const Graph& graph, const Node& node, const RunShape& shape, int ith, int nth);

  const KernelTable& kernels_;
  int memory_space_ = 0;
  ThreadPool pool_;
  NeuronStore* store_ = nullptr;
  ExpertStore* experts_ = nullptr;
  int64_t scratch_per_thread_ = 0;  // floats: attention tiles and softmax state (attention.h)
  std::vector<float> scratch_;
  int64_t split_items_ = 0;          // split-K attention: partial states and per-pair completion counts
  std::vector<float> split_partial_;
  std::unique_ptr<std::atomic<int32_t>[]> split_done_;
  int64_t max_neurons_ = 0;  // n_ff. Per thread: kAxpyTokens lists of nonzero activations (down_axpy)
  std::vector<int32_t> neuron_ids_;
  std::vector<float> neuron_coef_;
  std::vector<float> neuron_dense_;
  MoeScratchSize moe_size_;  // per thread: MoeMatMul's grouping of tokens by expert (moe_ops.h)
  std::vector<int32_t> moe_ints_;
  std::vector<uint8_t> moe_x_;
  std::vector<float> moe_out_;
  static constexpr int64_t kNoFailure = INT64_MAX;
  std::atomic<int64_t> failed_step_{kNoFailure};  // the step (node of the job) that failed first
  std::mutex error_mutex_;
  std::exception_ptr error_;
  int fault_node_ = -1, fault_thread_ = -1;
  bool op_timing_ = false;
  std::vector<double> op_seconds_ = std::vector<double>(kOpKinds, 0.0);
  std::vector<int64_t> op_calls_ = std::vector<int64_t>(kOpKinds, 0);
  std::vector<double> node_seconds_;  // grown by compute() only while timing: untimed runs allocate nothing
};

}  // namespace pyinfer
