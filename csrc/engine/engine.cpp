#include "engine/engine.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>

namespace pyinfer {

namespace {
constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

Engine::Engine(Graph graph, const EngineConfig& cfg) : graph_(std::move(graph)), cfg_(cfg) {
  if (cfg_.max_tokens < 1 || cfg_.max_outputs < 1 || cfg_.n_threads < 1)
    throw GraphError("max_tokens, max_outputs and n_threads must be positive");
  graph_.validate();
  plan_memory();
  for (const Node& n : graph_.nodes) {
    if (n.op == OpKind::GetRows && n.src[1] == graph_.input_tokens)
      vocab_rows_ = std::min(vocab_rows_, graph_.tensors[size_t(n.src[0])].rows);
    if (n.op == OpKind::KvStore && (n.src[1] == graph_.input_positions || n.src[1] == graph_.input_slots))
      cache_rows_ = std::min(cache_rows_, graph_.tensors[size_t(n.dst)].rows);
    if (n.op == OpKind::Attention && n.src[4] >= 0) block_size_ = n.i[3];
  }
  cpu_ = std::make_unique<CpuBackend>(graph_, cfg_.n_threads, cfg_.isa);
  std::vector<Backend*> backends{cpu_.get()};
  for (Node& n : graph_.nodes) n.backend = 0;  // only the CPU backend exists so far
  executor_ = std::make_unique<Executor>(graph_, backends, plan_segments(graph_, buffer_of_));
}

void Engine::plan_memory() {
  auto& ts = graph_.tensors;
  const size_t nt = ts.size();
  buffer_of_.assign(nt, -1);
  int next_buffer = 0;

  // Inputs and state: one region each, laid out in order.
  size_t input_bytes = 0, state_bytes = 0;
  std::vector<size_t> offset(nt, 0);
  for (size_t i = 0; i < nt; ++i) {
    Tensor& t = ts[i];
    if (t.row_mode == RowMode::Tokens) t.rows = cfg_.max_tokens;
    if (t.row_mode == RowMode::Outputs) t.rows = cfg_.max_outputs;
    if (t.rows <= 0) throw GraphError("tensor '" + t.name + "' has no rows");
    const size_t bytes = align_up(size_t(t.rows) * t.row_bytes);
    if (t.storage == Storage::External) {
      if (!t.data) throw GraphError("weight '" + t.name + "' has no data");
    } else if (t.storage == Storage::Input) {
      offset[i] = input_bytes;
      input_bytes += bytes;
      buffer_of_[i] = next_buffer++;
    } else if (t.storage == Storage::State) {
      offset[i] = state_bytes;
      state_bytes += bytes;
      buffer_of_[i] = next_buffer++;
    }
  }

  // Scratch: tensors share buffers once their last reader has run (a greedy, size-keyed reuse;
  // the repeated layer structure makes exact-size reuse nearly optimal).
  std::vector<int> first(nt, INT_MAX), last(nt, -1);
  for (size_t k = 0; k < graph_.nodes.size(); ++k) {
    const Node& n = graph_.nodes[k];
    first[size_t(n.dst)] = std::min(first[size_t(n.dst)], int(k));
    last[size_t(n.dst)] = std::max(last[size_t(n.dst)], int(k));
    for (int s : n.src)
      if (s >= 0) last[size_t(s)] = std::max(last[size_t(s)], int(k));
  }
  if (graph_.output_logits >= 0) last[size_t(graph_.output_logits)] = INT_MAX;
  for (int t : graph_.pinned)
    if (t >= 0 && size_t(t) < nt) last[size_t(t)] = INT_MAX;
  std::multimap<size_t, std::pair<int, size_t>> free_slots;  // bytes -> (buffer id, offset)
  std::vector<std::pair<int, size_t>> slot_of(nt, {-1, 0});
  size_t scratch_bytes = 0;
  for (size_t k = 0; k < graph_.nodes.size(); ++k) {
    const Node& n = graph_.nodes[k];
    for (int s : n.src)
      if (s >= 0 && ts[size_t(s)].storage == Storage::Scratch && slot_of[size_t(s)].first < 0)
        throw GraphError("tensor '" + ts[size_t(s)].name + "' is read before any node writes it");
    const size_t d = size_t(n.dst);
    if (ts[d].storage == Storage::Scratch && slot_of[d].first < 0) {
      const size_t bytes = align_up(size_t(ts[d].rows) * ts[d].row_bytes);
      auto it = free_slots.find(bytes);
      if (it != free_slots.end()) {
        slot_of[d] = it->second;
        free_slots.erase(it);
      } else {
        slot_of[d] = {next_buffer++, scratch_bytes};
        scratch_bytes += bytes;
      }
    }
    std::vector<int> touched(n.src.begin(), n.src.end());
    touched.push_back(n.dst);
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (int t : touched)
      if (t >= 0 && ts[size_t(t)].storage == Storage::Scratch && last[size_t(t)] == int(k))
        free_slots.emplace(align_up(size_t(ts[size_t(t)].rows) * ts[size_t(t)].row_bytes), slot_of[size_t(t)]);
  }

  inputs_ = Buffer(input_bytes);
  state_ = Buffer(state_bytes);
  scratch_ = Buffer(scratch_bytes);
  for (size_t i = 0; i < nt; ++i) {
    Tensor& t = ts[i];
    auto* base = [&]() -> uint8_t* {
      switch (t.storage) {
        case Storage::Input: return static_cast<uint8_t*>(inputs_.data()) + offset[i];
        case Storage::State: return static_cast<uint8_t*>(state_.data()) + offset[i];
        case Storage::Scratch:
          if (slot_of[i].first < 0) return nullptr;  // never written: unused tensor
          buffer_of_[i] = slot_of[i].first;
          return static_cast<uint8_t*>(scratch_.data()) + slot_of[i].second;
        default: return static_cast<uint8_t*>(t.data);
      }
    }();
    t.data = base;
  }
}

void Engine::run(const int32_t* tokens, const int32_t* positions, int64_t n_tokens, const int32_t* out_ids,
                 int64_t n_outputs, const int32_t* slots, const int32_t* kv_table, int64_t kv_table_cols) {
  if (n_tokens < 1 || n_tokens > cfg_.max_tokens)
    throw GraphError("batch of " + std::to_string(n_tokens) + " tokens; this engine takes 1.." +
                     std::to_string(cfg_.max_tokens));
  if (n_outputs < 0 || n_outputs > cfg_.max_outputs)
    throw GraphError(std::to_string(n_outputs) + " outputs requested; at most " + std::to_string(cfg_.max_outputs));
  auto bind = [&](int id, const int32_t* src, int64_t n, int64_t limit, const char* what) {
    if (id < 0) return;
    if (!src) throw GraphError(std::string("missing input: ") + what);
    for (int64_t i = 0; i < n; ++i)
      if (src[i] < 0 || src[i] >= limit)
        throw GraphError(std::string(what) + " " + std::to_string(src[i]) + " out of range [0, " +
                         std::to_string(limit) + ")");
    std::memcpy(graph_.tensors[size_t(id)].data, src, size_t(n) * sizeof(int32_t));
  };
  bind(graph_.input_tokens, tokens, n_tokens, vocab_rows_, "token id");
  if (graph_.input_kv_table >= 0) {  // paged: positions are bounded by each token's block table
    const Tensor& table = graph_.tensors[size_t(graph_.input_kv_table)];
    if (kv_table_cols != table.cols)
      throw GraphError("block table has " + std::to_string(kv_table_cols) + " columns, expected " +
                       std::to_string(table.cols));
    bind(graph_.input_positions, positions, n_tokens, table.cols * block_size_, "position");
    bind(graph_.input_slots, slots, n_tokens, cache_rows_, "KV slot");
    bind(graph_.input_kv_table, kv_table, n_tokens * table.cols, cache_rows_ / block_size_, "KV block");
  } else {
    bind(graph_.input_positions, positions, n_tokens, cache_rows_, "position");
  }
  bind(graph_.input_out_ids, out_ids, n_outputs, n_tokens, "output row");
  executor_->run(RunShape{n_tokens, n_outputs});
}

}  // namespace pyinfer
