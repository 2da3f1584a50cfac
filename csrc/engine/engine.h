// The engine owns a validated graph, its memory, its backends and its executor. Everything is
// allocated in the constructor; run() only checks and binds inputs, then computes.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "engine/buffer.h"
#include "executor/executor.h"
#include "offload/neuron_store.h"
#include "graph/graph.h"

namespace pyinfer {

struct EngineConfig {
  int64_t max_tokens = 512;   // rows of every per-token activation (the micro-batch)
  int64_t max_outputs = 1;    // rows of every per-output activation (logits)
  int n_threads = 1;
  std::string isa = "auto";
  // Threads of each CPU backend instance; empty: one backend of n_threads. Node.backend indexes this list,
  // so a second instance (its own pool and cores) can run part of the graph at the same time as the first.
  std::vector<int> backend_threads;
  // Where the graph's paged weights come from (NeuronFetch nodes); shared with the graph's builder.
  std::shared_ptr<NeuronStore> neuron_store;
};

// What every run checks of one named input before the graph reads it.
struct InputCheck {
  int tensor = -1;
  const char* what = "";
  int64_t limit = INT32_MAX;  // entries lie in [0, limit)
  bool below_tokens = false;  // entries are batch rows: < the run's token count
  bool distinct = false;      // KV rows written by one run: no two equal (two threads would write one row)
};

class Engine {
 public:
  Engine(Graph graph, const EngineConfig& cfg);

  // Computes one batch. tokens/positions: n_tokens entries (nullptr where the graph has no such
  // input); out_ids: n_outputs batch rows whose logits are wanted. Paged graphs (many sequences) also
  // take each token's KV slot and its sequence's block table ([n_tokens, kv_table_cols]).
  // Throws GraphError on bad input; an exception on any executor or pool thread is rethrown here.
  // Safe to call from several threads: runs of one engine are serialized.
  void run(const int32_t* tokens, const int32_t* positions, int64_t n_tokens, const int32_t* out_ids,
           int64_t n_outputs, const int32_t* slots = nullptr, const int32_t* kv_table = nullptr,
           int64_t kv_table_cols = 0);

  const Graph& graph() const { return graph_; }
  const EngineConfig& config() const { return cfg_; }
  const CpuBackend& cpu() const { return *backends_[0]; }
  CpuBackend& cpu() { return *backends_[0]; }
  size_t n_backends() const { return backends_.size(); }
  CpuBackend& backend(size_t i) { return *backends_.at(i); }
  const Executor& executor() const { return *executor_; }
  Executor& executor_mut() { return *executor_; }
  size_t scratch_bytes() const { return scratch_.size(); }
  size_t state_bytes() const { return state_.size(); }
  // Makes the KV cache, state and scratch resident now instead of page by page as runs first touch them
  // (a server reserves its whole KV budget at start; between runs only).
  void reserve_memory();
  // The mutex run() holds: a caller that reads the run's outputs (logits) holds it across run + read.
  std::mutex& run_mutex() { return run_mutex_; }

 private:
  void copy_constants();
  void plan_memory();
  void check_row_coverage();
  void plan_input_checks();
  void check_inputs(int64_t n_tokens, int64_t n_outputs);

  Graph graph_;
  EngineConfig cfg_;
  Buffer constants_, scratch_, state_, inputs_;
  std::vector<int> buffer_of_;  // tensor -> buffer id (-1: external)
  std::vector<std::unique_ptr<CpuBackend>> backends_;
  std::unique_ptr<Executor> executor_;
  std::mutex run_mutex_;
  std::vector<InputCheck> input_checks_;
  std::pair<int64_t, std::string> row_limit_[2];  // most tokens / outputs a run may have, and the tensor that says so
  int64_t kv_blocks_ = 0;      // paged: blocks in the cache (table entries lie in [0, kv_blocks_))
  int64_t block_size_ = 0;     // paged: tokens per block
  std::vector<uint32_t> stamp_;  // distinctness checks: the run's stamp per KV row or block
  uint32_t stamp_gen_ = 0;
};

}  // namespace pyinfer
