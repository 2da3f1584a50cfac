// The engine owns a validated graph, its memory and its executor. Everything is allocated in
// the constructor; run() only binds inputs and computes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "engine/buffer.h"
#include "executor/executor.h"
#include "graph/graph.h"

namespace pyinfer {

struct EngineConfig {
  int64_t max_tokens = 512;   // rows of every per-token activation (the micro-batch)
  int64_t max_outputs = 1;    // rows of every per-output activation (logits)
  int n_threads = 1;
  std::string isa = "auto";
};

class Engine {
 public:
  Engine(Graph graph, const EngineConfig& cfg);

  // Computes one batch. tokens/positions: n_tokens entries (nullptr where the graph has no such
  // input); out_ids: n_outputs batch rows whose logits are wanted. Paged graphs (many sequences) also
  // take each token's KV slot and its sequence's block table ([n_tokens, kv_table_cols]).
  // Throws GraphError on bad input.
  void run(const int32_t* tokens, const int32_t* positions, int64_t n_tokens, const int32_t* out_ids,
           int64_t n_outputs, const int32_t* slots = nullptr, const int32_t* kv_table = nullptr,
           int64_t kv_table_cols = 0);

  const Graph& graph() const { return graph_; }
  const EngineConfig& config() const { return cfg_; }
  const CpuBackend& cpu() const { return *cpu_; }
  CpuBackend& cpu() { return *cpu_; }
  size_t scratch_bytes() const { return scratch_.size(); }
  size_t state_bytes() const { return state_.size(); }
  int64_t vocab_rows() const { return vocab_rows_; }     // valid token ids: [0, vocab_rows)
  int64_t context_rows() const { return cache_rows_; }   // KV cache rows (single sequence: valid positions)

 private:
  void plan_memory();

  Graph graph_;
  EngineConfig cfg_;
  Buffer scratch_, state_, inputs_;
  std::vector<int> buffer_of_;  // tensor -> buffer id (-1: external)
  std::unique_ptr<CpuBackend> cpu_;
  std::unique_ptr<Executor> executor_;
  int64_t vocab_rows_ = INT64_MAX;
  int64_t cache_rows_ = INT64_MAX;
  int64_t block_size_ = 1;
};

}  // namespace pyinfer
