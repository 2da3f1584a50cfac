// The engine owns a validated graph, its memory, its backends and its executor. Everything is
// allocated in the constructor; run() only checks and binds inputs, then computes.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "engine/buffer.h"
#include "engine/copy_planner.h"
#include "executor/executor.h"
#include "offload/expert_store.h"
#include "offload/neuron_store.h"
#include "graph/graph.h"

namespace pyinfer {

struct EngineConfig {
  int64_t max_tokens = 512;   // rows of every per-token activation (the micro-batch)
  int64_t max_outputs = 1;    // rows of every per-output activation (logits)
  int n_threads = 1;
  std::string isa = "auto";
  // Threads of each CPU backend instance; empty: one backend of n_threads. `placement` indexes this list,
  // so a second instance (its own pool and cores) can run part of the graph at the same time as the first.
  std::vector<int> backend_threads;
  // The backend of each node (empty: all on backend 0). Placement is the engine's plan, not the graph's.
  std::vector<int> placement;
  // The memory space of each backend (empty: all host memory, 0). A CPU backend given another space stands in
  // for a device: buffers of its own, weights uploaded to it, Copy nodes where tensors cross (copy_planner.h).
  std::vector<int> backend_memory;
  // Where the graph's paged weights come from (NeuronFetch nodes); shared with the graph's builder.
  std::shared_ptr<NeuronStore> neuron_store;
  // Where the graph's offloaded experts come from (ExpertFetch nodes).
  std::shared_ptr<ExpertStore> expert_store;
  // How to make backend i when it is not a CPU backend (a GPU): missing or empty entries are CPU backends.
  // The maker gets the graph (after copies are inserted) and the backend's memory space.
  using BackendMaker = std::function<std::unique_ptr<Backend>(const Graph&, int memory_space)>;
  std::vector<BackendMaker> backend_makers;
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
           int64_t kv_table_cols = 0, const int32_t* state_rows = nullptr);

  const Graph& graph() const { return graph_; }
  const EngineConfig& config() const { return cfg_; }
  // Backend i as a CPU backend (op timing, fault injection), or GraphError when it is another kind.
  CpuBackend& cpu(size_t i = 0) const {
    auto* c = dynamic_cast<CpuBackend*>(backends_.at(i).get());
    if (!c) throw GraphError("backend " + std::to_string(i) + " is not a CPU backend");
    return *c;
  }
  size_t n_backends() const { return backends_.size(); }
  Backend& backend(size_t i) const { return *backends_.at(i); }
  const Executor& executor() const { return *executor_; }
  Executor& executor_mut() { return *executor_; }
  size_t scratch_bytes() const { return scratch_.size(); }
  // Bytes of a device's memory (state and scratch) the engine holds, over every space but host memory.
  size_t device_bytes() const {
    size_t n = 0;
    for (const auto& m : device_memory_) n += m.bytes;
    return n;
  }
  const CopyPlan& copy_plan() const { return copy_plan_; }
  // The tensor holding tensor `id`'s value in host memory after a run (logits and pinned tensors).
  int host_tensor(int id) const {
    return id >= 0 && size_t(id) < copy_plan_.host_of.size() ? copy_plan_.host_of[size_t(id)] : id;
  }
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
  Backend* space_owner(int space) const;

  // Memory of a device space, handed back to the backend that gave it.
  struct DeviceMemory {
    Backend* owner;
    void* data;
    size_t bytes;
    DeviceMemory(Backend* o, void* d, size_t b) : owner(o), data(d), bytes(b) {}
    DeviceMemory(DeviceMemory&& m) noexcept : owner(m.owner), data(m.data), bytes(m.bytes) { m.data = nullptr; }
    DeviceMemory(const DeviceMemory&) = delete;
    ~DeviceMemory() { if (data) owner->release(data, bytes); }
  };

  std::vector<int> buffer_of_;  // tensor -> buffer id (-1: external)
  CopyPlan copy_plan_;
  std::vector<std::unique_ptr<Backend>> backends_;  // the engine sees only the interface
  std::vector<DeviceMemory> device_memory_;  // after backends_: released while their owners live
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
