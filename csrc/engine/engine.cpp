#include "engine/engine.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <tuple>

namespace pyinfer {

namespace {
constexpr size_t kAlign = 64;
constexpr int kSpaces = 64;  // memory spaces: 0 is host memory
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

Engine::Engine(Graph graph, const EngineConfig& cfg) : graph_(std::move(graph)), cfg_(cfg) {
  if (cfg_.max_tokens < 1 || cfg_.max_outputs < 1 || cfg_.n_threads < 1)
    throw GraphError("max_tokens, max_outputs and n_threads must be positive");
  if (cfg_.max_tokens > INT32_MAX || cfg_.max_outputs > INT32_MAX || cfg_.n_threads > 1024)
    throw GraphError("max_tokens, max_outputs or n_threads is too large");
  if (cfg_.backend_threads.empty()) cfg_.backend_threads = {cfg_.n_threads};
  for (int t : cfg_.backend_threads)
    if (t < 1 || t > 1024) throw GraphError("every backend needs 1..1024 threads");
  copy_constants();  // before validation: the checked constants are the ones that run
  graph_.validate();
  if (cfg_.placement.empty()) cfg_.placement.assign(graph_.nodes.size(), 0);
  if (cfg_.placement.size() != graph_.nodes.size())
    throw GraphError("the placement names a backend for " + std::to_string(cfg_.placement.size()) +
                     " nodes; the graph has " + std::to_string(graph_.nodes.size()));
  for (int b : cfg_.placement)
    if (b < 0 || size_t(b) >= cfg_.backend_threads.size())
      throw GraphError("the placement names backend " + std::to_string(b) + "; this engine has " +
                       std::to_string(cfg_.backend_threads.size()));
  if (cfg_.backend_memory.empty()) cfg_.backend_memory.assign(cfg_.backend_threads.size(), 0);
  if (cfg_.backend_memory.size() != cfg_.backend_threads.size())
    throw GraphError("backend_memory names a memory space for each backend");
  for (int space : cfg_.backend_memory)
    if (space < 0 || space > 63) throw GraphError("memory spaces are 0 (host) .. 63");
  for (size_t k = 0; k < graph_.nodes.size(); ++k) {
    const Node& n = graph_.nodes[k];
    if (n.op == OpKind::NeuronFetch && cfg_.backend_memory[size_t(cfg_.placement[k])] != 0)
      throw GraphError("neuron_fetch reads into host memory: place it on a host backend");
    const int layer = n.p.neuron_fetch.layer;
    if (n.op == OpKind::NeuronFetch && (!cfg_.neuron_store || layer >= cfg_.neuron_store->n_layers()))
      throw GraphError("a neuron_fetch node names layer " + std::to_string(layer) + ", which the neuron store " +
                       (cfg_.neuron_store ? "does not have" : "is missing for"));
    if (n.op == OpKind::ExpertFetch) {
      if (cfg_.backend_memory[size_t(cfg_.placement[k])] != 0)
        throw GraphError("expert_fetch reads into host memory: place it on a host backend");
      const int el = n.p.expert_fetch.layer;
      if (!cfg_.expert_store || el >= cfg_.expert_store->n_layers())
        throw GraphError("an expert_fetch node names layer " + std::to_string(el) + ", which the expert store " +
                         (cfg_.expert_store ? "does not have" : "is missing for"));
    }
  }
  copy_plan_ = insert_copies(graph_, cfg_.placement, cfg_.backend_memory);
  if (copy_plan_.copies || !copy_plan_.uploads.empty()) graph_.validate();  // the copies too
  for (size_t b = 0; b < cfg_.backend_threads.size(); ++b) {
    if (b < cfg_.backend_makers.size() && cfg_.backend_makers[b]) {
      backends_.push_back(cfg_.backend_makers[b](graph_, cfg_.backend_memory[b]));
      continue;
    }
    auto cpu = std::make_unique<CpuBackend>(graph_, cfg_.backend_threads[b], cfg_.isa, cfg_.backend_memory[b],
                                            cfg_.max_tokens);
    cpu->set_neuron_store(cfg_.neuron_store.get());
    cpu->set_expert_store(cfg_.expert_store.get());
    backends_.push_back(std::move(cpu));
  }
  for (size_t k = 0; k < graph_.nodes.size(); ++k) {  // a device backend runs only the ops it has kernels for
    const Backend& be = *backends_[size_t(cfg_.placement[k])];
    if (!be.supports(graph_, graph_.nodes[k]))
      throw GraphError("backend " + be.name() + " cannot run node " + std::to_string(k) + " (" +
                       op_name(graph_.nodes[k].op) + "): place it on the CPU");
  }
  plan_memory();
  check_row_coverage();
  plan_input_checks();
  for (const auto& [mirror, weight] : copy_plan_.uploads) {
    const Tensor& m = graph_.tensors[size_t(mirror)];
    const Tensor& w = graph_.tensors[size_t(weight)];
    Backend& dev = *space_owner(m.memory);
    if (w.row_stride == w.row_bytes && m.row_stride == w.row_bytes)  // contiguous: one copy
      dev.copy(m.data, w.data, size_t(w.rows) * w.row_bytes);
    else
      for (int64_t r = 0; r < w.rows; ++r)  // row by row: the weight is a view with a wider stride
        dev.copy(static_cast<uint8_t*>(m.data) + r * int64_t(m.row_stride),
                 static_cast<const uint8_t*>(w.data) + r * int64_t(w.row_stride), w.row_bytes);
    dev.synchronize();
  }
  std::vector<Backend*> backends;
  for (auto& b : backends_) backends.push_back(b.get());
  executor_ = std::make_unique<Executor>(graph_, backends, plan_segments(graph_, cfg_.placement, buffer_of_));
}

Backend* Engine::space_owner(int space) const {
  for (const auto& b : backends_)
    if (b->memory_space() == space) return b.get();
  throw GraphError("no backend has memory space " + std::to_string(space));
}

// I32 constants (permutations, row maps, constant lists) are checked by validate(); the engine runs its own
// copy, so a caller who later writes into the array it passed cannot put an id out of range.
void Engine::copy_constants() {
  size_t bytes = 0;
  for (const Tensor& t : graph_.tensors)
    if (t.storage == Storage::External && t.type == DType::I32) bytes += align_up(checked_bytes(t.name, t.rows, t.row_bytes));
  constants_ = Buffer(bytes);
  size_t off = 0;
  for (Tensor& t : graph_.tensors) {
    if (t.storage != Storage::External || t.type != DType::I32) continue;
    if (!t.data) throw GraphError("weight '" + t.name + "' has no data");
    auto* dst = static_cast<uint8_t*>(constants_.data()) + off;
    std::memcpy(dst, t.data, size_t(t.rows) * t.row_bytes);
    t.data = dst;
    off += align_up(size_t(t.rows) * t.row_bytes);
  }
}

void Engine::plan_memory() {
  auto& ts = graph_.tensors;
  const size_t nt = ts.size();
  buffer_of_.assign(nt, -1);
  int next_buffer = 0;

  // Inputs (host memory) and state (per memory space): one region each, laid out in order.
  size_t input_bytes = 0;
  std::vector<size_t> state_bytes(kSpaces, 0), scratch_bytes(kSpaces, 0);
  std::vector<size_t> offset(nt, 0);
  // A view's readers and writers touch its root's memory: lifetimes, buffers and dependencies follow the root.
  std::vector<int> root(nt);
  for (size_t i = 0; i < nt; ++i) root[i] = ts[i].view_of >= 0 ? root[size_t(ts[i].view_of)] : int(i);
  auto rt = [&](int t) { return t < 0 ? t : root[size_t(t)]; };
  for (size_t i = 0; i < nt; ++i) {
    Tensor& t = ts[i];
    if (t.row_mode == RowMode::Tokens) t.rows = cfg_.max_tokens;
    if (t.row_mode == RowMode::Outputs) t.rows = cfg_.max_outputs;
    if (t.rows <= 0) throw GraphError("tensor '" + t.name + "' has no rows");
    const size_t bytes = align_up(checked_bytes(t.name, t.rows, t.row_bytes));
    if (t.view_of >= 0) continue;
    if (t.storage == Storage::External) {
      if (!t.data) throw GraphError("weight '" + t.name + "' has no data");
    } else if (t.storage == Storage::Input) {
      offset[i] = input_bytes;
      input_bytes += bytes;
      buffer_of_[i] = next_buffer++;
    } else if (t.storage == Storage::State) {
      offset[i] = state_bytes[size_t(t.memory)];
      state_bytes[size_t(t.memory)] += bytes;
      buffer_of_[i] = next_buffer++;
    }
  }

  // Scratch: tensors share buffers once their last reader has run (a greedy, size-keyed reuse;
  // the repeated layer structure makes exact-size reuse nearly optimal). Active lists share only with
  // other active lists, so whatever a list buffer holds is a list some ActiveSet wrote (or zeros: empty).
  std::vector<uint8_t> is_list(nt, 0);
  for (const Node& n : graph_.nodes)  // a copy of a list is a list (copies follow their source in node order)
    if (n.op == OpKind::ActiveSet || (n.op == OpKind::Copy && is_list[size_t(rt(n.src[0]))]))
      is_list[size_t(rt(n.dst))] = 1;
  std::vector<int> last(nt, -1);
  for (size_t k = 0; k < graph_.nodes.size(); ++k) {
    const Node& n = graph_.nodes[k];
    last[size_t(rt(n.dst))] = std::max(last[size_t(rt(n.dst))], int(k));
    for (int s : n.src)
      if (s >= 0) last[size_t(rt(s))] = std::max(last[size_t(rt(s))], int(k));
  }
  if (graph_.output_logits >= 0) last[size_t(rt(graph_.output_logits))] = INT_MAX;
  for (int t : graph_.pinned)
    if (t >= 0 && size_t(t) < nt) last[size_t(rt(t))] = INT_MAX;
  // Which backends touch each tensor: a buffer freed by one backend is reused only by a writer on that same
  // backend, and a tensor two backends share is never reused, so reuse adds no wait between backends (the
  // two halves of a split layer must not order each other through a recycled buffer).
  std::vector<uint64_t> backends_of(nt, 0);
  for (size_t k = 0; k < graph_.nodes.size(); ++k) {
    const Node& n = graph_.nodes[k];
    const uint64_t bit = uint64_t(1) << (cfg_.placement[k] & 63);
    backends_of[size_t(rt(n.dst))] |= bit;
    for (int s : n.src)
      if (s >= 0) backends_of[size_t(rt(s))] |= bit;
  }
  auto single = [](uint64_t m) { return m != 0 && (m & (m - 1)) == 0; };
  // bytes, list, backend, memory space: a slot is an offset in its space's scratch, so it is reused only there
  // (a Copy node on a device's backend writes host memory, its other nodes the device's).
  using SlotKey = std::tuple<size_t, uint8_t, int, int>;
  std::multimap<SlotKey, std::pair<int, size_t>> free_slots;  // -> (buffer, offset)
  std::vector<std::pair<int, size_t>> slot_of(nt, {-1, 0});
  for (size_t k = 0; k < graph_.nodes.size(); ++k) {
    const Node& n = graph_.nodes[k];
    for (int s : n.src)
      if (s >= 0 && ts[size_t(s)].storage == Storage::Scratch && slot_of[size_t(rt(s))].first < 0)
        throw GraphError("tensor '" + ts[size_t(s)].name + "' is read before any node writes it");
    const size_t d = size_t(rt(n.dst));
    if (ts[d].storage == Storage::Scratch && slot_of[d].first < 0) {
      const size_t bytes = align_up(size_t(ts[d].rows) * ts[d].row_bytes);
      auto it = free_slots.find(SlotKey{bytes, is_list[d], cfg_.placement[k], ts[d].memory});
      if (it != free_slots.end()) {
        slot_of[d] = it->second;
        free_slots.erase(it);
      } else {
        slot_of[d] = {next_buffer++, scratch_bytes[size_t(ts[d].memory)]};
        scratch_bytes[size_t(ts[d].memory)] += bytes;
      }
    }
    std::vector<int> touched;
    for (int s : n.src) touched.push_back(rt(s));
    touched.push_back(rt(n.dst));
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (int t : touched)
      if (t >= 0 && ts[size_t(t)].storage == Storage::Scratch && last[size_t(t)] == int(k) &&
          single(backends_of[size_t(t)]))
        free_slots.emplace(SlotKey{align_up(size_t(ts[size_t(t)].rows) * ts[size_t(t)].row_bytes),
                                   is_list[size_t(t)], cfg_.placement[k], ts[size_t(t)].memory},
                           slot_of[size_t(t)]);
  }

  inputs_ = Buffer(input_bytes);
  state_ = Buffer(state_bytes[0]);
  scratch_ = Buffer(scratch_bytes[0]);
  std::vector<uint8_t*> state_base(kSpaces, nullptr), scratch_base(kSpaces, nullptr);
  state_base[0] = static_cast<uint8_t*>(state_.data());
  scratch_base[0] = static_cast<uint8_t*>(scratch_.data());
  for (int space = 1; space < kSpaces; ++space) {  // a device's memory, from its backend
    if (!state_bytes[size_t(space)] && !scratch_bytes[size_t(space)]) continue;
    Backend* owner = space_owner(space);
    for (auto [bytes, base] : {std::pair<size_t, uint8_t**>{state_bytes[size_t(space)], &state_base[size_t(space)]},
                               {scratch_bytes[size_t(space)], &scratch_base[size_t(space)]}}) {
      device_memory_.push_back(DeviceMemory{owner, owner->alloc(bytes), bytes});
      *base = static_cast<uint8_t*>(device_memory_.back().data);
    }
  }
  for (size_t i = 0; i < nt; ++i) {
    Tensor& t = ts[i];
    if (t.view_of >= 0) {  // its base has a lower id: already bound
      const Tensor& base = ts[size_t(t.view_of)];
      t.data = base.data ? static_cast<uint8_t*>(base.data) + t.offset : nullptr;
      buffer_of_[i] = buffer_of_[size_t(root[i])];
      continue;
    }
    auto* base = [&]() -> uint8_t* {
      switch (t.storage) {
        case Storage::Input: return static_cast<uint8_t*>(inputs_.data()) + offset[i];
        case Storage::State: return state_base[size_t(t.memory)] + offset[i];
        case Storage::Scratch:
          if (slot_of[i].first < 0) return nullptr;  // never written: unused tensor
          buffer_of_[i] = slot_of[i].first;
          return scratch_base[size_t(t.memory)] + slot_of[i].second;
        default: return static_cast<uint8_t*>(t.data);
      }
    }();
    t.data = base;
  }
}

// Every row an op reads must exist. A source read at each row of another tensor has at least as many
// rows as that tensor has in any run: fixed tensors are checked here; per-token and per-output tensors
// bound the run's token and output counts (a test feeding a 4-row weight as input runs at most 4 tokens).
void Engine::check_row_coverage() {
  const auto& ts = graph_.tensors;
  row_limit_[0] = {cfg_.max_tokens, ""};
  row_limit_[1] = {cfg_.max_outputs, ""};
  for (size_t k = 0; k < graph_.nodes.size(); ++k) {
    const Node& n = graph_.nodes[k];
    auto covers = [&](int reader, int read) {  // `read` is read at every row `reader` has in a run
      if (read < 0 || reader < 0) return;
      const Tensor& a = ts[size_t(read)];
      const Tensor& b = ts[size_t(reader)];
      if (b.row_mode == RowMode::Fixed) {
        if (a.rows < b.rows)
          throw GraphError("node " + std::to_string(k) + " (" + op_name(n.op) + "): tensor '" + a.name + "' has " +
                           std::to_string(a.rows) + " rows, fewer than the " + std::to_string(b.rows) + " of '" +
                           b.name + "'");
        return;
      }
      auto& limit = row_limit_[b.row_mode == RowMode::Tokens ? 0 : 1];
      if (a.rows < limit.first) limit = {a.rows, a.name};
    };
    switch (n.op) {
      case OpKind::MatMul:
        if (n.src[2] >= 0) {
          covers(n.dst, n.src[1]);
          if (ts[size_t(n.src[2])].row_mode != RowMode::Fixed) covers(n.dst, n.src[2]);
        } else {
          covers(n.src[1], n.dst);
        }
        break;
      case OpKind::KvStore: covers(n.src[0], n.src[1]); break;
      case OpKind::Attention:
        covers(n.dst, n.src[0]); covers(n.dst, n.src[3]); covers(n.dst, n.src[4]); covers(n.dst, n.src[6]);
        break;
      case OpKind::GetRows: case OpKind::SelectRows: covers(n.dst, n.src[1]); break;
      case OpKind::RmsNorm: case OpKind::Quantize: case OpKind::BiasRelu: case OpKind::ScatterCols:
      case OpKind::ActiveSet: case OpKind::Softcap:
        covers(n.dst, n.src[0]);
        break;
      case OpKind::Rope: covers(n.dst, n.src[0]); covers(n.dst, n.src[1]); break;
      case OpKind::Add:  // a bias row is read for every row
        covers(n.dst, n.src[0]);
        if (!is_bias_row(ts[size_t(n.src[1])])) covers(n.dst, n.src[1]);
        break;
      case OpKind::SiluMul: covers(n.dst, n.src[0]); covers(n.dst, n.src[1]); break;
      case OpKind::GatedAct: covers(n.dst, n.src[0]); covers(n.dst, n.src[1]); covers(n.dst, n.src[2]); break;
      case OpKind::DownAxpy: covers(n.dst, n.src[1]); covers(n.dst, n.src[2]); break;
      case OpKind::Copy: covers(n.dst, n.src[0]); break;
      case OpKind::MoeRoute: covers(n.dst, n.src[0]); break;
      case OpKind::MoeRouteSplit: covers(n.dst, n.src[0]); break;
      case OpKind::ExpertFetch: break;  // reads the route rows the run has, writes one marker
      case OpKind::MoeMatMul: covers(n.dst, n.src[1]); covers(n.dst, n.src[2]); covers(n.dst, n.src[3]); break;
      case OpKind::MoeCombine:
        for (int s : n.src) covers(n.dst, s);
        break;
      case OpKind::SsmConv:
        covers(n.dst, n.src[SsmConvSrc::x]); covers(n.dst, n.src[SsmConvSrc::positions]);
        covers(n.dst, n.src[SsmConvSrc::rows]);
        break;
      case OpKind::DeltaNet:
        for (int s : {DeltaNetSrc::qkv, DeltaNetSrc::beta, DeltaNetSrc::alpha, DeltaNetSrc::positions, DeltaNetSrc::rows})
          covers(n.dst, n.src[s]);
        break;
      default: break;
    }
  }
}

void Engine::plan_input_checks() {
  const auto& ts = graph_.tensors;
  if (graph_.input_kv_table >= 0 && graph_.input_positions < 0) throw GraphError("a paged graph needs positions");
  input_checks_.reserve(8);  // one per named input: pointers into it stay valid while it is filled
  auto check_of = [&](int id) -> InputCheck* {
    id = graph_.origin(id);  // a device reads a copy of the input
    const char* role = graph_.input_role(id);
    if (!role || role == std::string("kv_table")) return nullptr;  // constants: checked by validate()
    for (auto& c : input_checks_)
      if (c.tensor == id) return &c;
    const std::string r = role;
    const char* what = r == "tokens" ? "token id" : r == "positions" ? "position" : r == "out_ids" ? "output row"
                       : r == "state_rows" ? "state row" : "KV slot";
    input_checks_.push_back(InputCheck{id, what});
    return &input_checks_.back();
  };
  for (int role : {graph_.input_tokens, graph_.input_positions, graph_.input_out_ids, graph_.input_slots}) check_of(role);
  int64_t stamp_rows = 0;
  for (const Node& n : graph_.nodes) {
    InputCheck* c = nullptr;
    switch (n.op) {
      case OpKind::GetRows:
        if ((c = check_of(n.src[1]))) c->limit = std::min(c->limit, ts[size_t(n.src[0])].rows);
        break;
      case OpKind::SelectRows:
        if ((c = check_of(n.src[1]))) {
          const Tensor& x = ts[size_t(n.src[0])];
          if (x.row_mode == RowMode::Fixed) c->limit = std::min(c->limit, x.rows);
          else c->below_tokens = true;
        }
        break;
      case OpKind::SsmConv:
      case OpKind::DeltaNet: {  // each token's state row lies in the state
        const int rows = n.op == OpKind::SsmConv ? n.src[SsmConvSrc::rows] : n.src[DeltaNetSrc::rows];
        const int state = n.op == OpKind::SsmConv ? n.src[SsmConvSrc::state] : n.src[DeltaNetSrc::state];
        if (rows >= 0 && (c = check_of(rows))) c->limit = std::min(c->limit, ts[size_t(state)].rows);
        break;
      }
      case OpKind::KvStore:
        if ((c = check_of(n.src[1]))) {
          c->limit = std::min(c->limit, ts[size_t(n.dst)].rows);
          c->distinct = true;
          stamp_rows = std::max(stamp_rows, ts[size_t(n.dst)].rows);
        }
        break;
      case OpKind::Attention: {
        using S = AttentionSrc;
        const int64_t cache_rows = ts[size_t(n.src[S::k_cache])].rows;  // positions index cache rows
        const int64_t block = n.p.attention.block_size;
        if ((c = check_of(n.src[S::positions]))) {
          c->limit = std::min(c->limit, cache_rows);
          if (n.src[S::table] >= 0) c->limit = std::min(c->limit, ts[size_t(n.src[S::table])].cols * block);
        }
        if (n.src[S::table] >= 0) {
          block_size_ = block;
          kv_blocks_ = kv_blocks_ ? std::min(kv_blocks_, cache_rows / block) : cache_rows / block;
        }
        break;
      }
      default: break;
    }
  }
  stamp_.assign(size_t(std::max(stamp_rows, kv_blocks_)), 0);
}

void Engine::check_inputs(int64_t n_tokens, int64_t n_outputs) {
  auto next_stamp = [&]() {
    if (++stamp_gen_ == 0) {  // wrapped: forget every old stamp
      std::fill(stamp_.begin(), stamp_.end(), 0u);
      stamp_gen_ = 1;
    }
    return stamp_gen_;
  };
  for (const InputCheck& c : input_checks_) {
    const Tensor& t = graph_.tensors[size_t(c.tensor)];
    const auto* v = static_cast<const int32_t*>(t.data);
    const int64_t n = t.row_mode == RowMode::Outputs ? n_outputs : n_tokens;
    const int64_t limit = c.below_tokens ? std::min(c.limit, n_tokens) : c.limit;
    const uint32_t stamp = c.distinct ? next_stamp() : 0;
    for (int64_t i = 0; i < n; ++i) {
      if (v[i] < 0 || v[i] >= limit)
        throw GraphError(std::string(c.what) + " " + std::to_string(v[i]) + " out of range [0, " +
                         std::to_string(limit) + ")");
      if (c.distinct) {
        if (stamp_[size_t(v[i])] == stamp)
          throw GraphError(std::string(c.what) + " " + std::to_string(v[i]) + " appears twice in one batch (one KV row "
                           "written by two threads)");
        stamp_[size_t(v[i])] = stamp;
      }
    }
  }
  if (graph_.input_kv_table < 0) return;
  // Paged: each token's block table, as far as its position reaches, holds distinct blocks of the cache,
  // and its KV slot is its position's row in them.
  const Tensor& table = graph_.tensors[size_t(graph_.input_kv_table)];  // its width was checked by run()
  const auto* pos = static_cast<const int32_t*>(graph_.tensors[size_t(graph_.input_positions)].data);
  const auto* slots = graph_.input_slots >= 0 ? static_cast<const int32_t*>(graph_.tensors[size_t(graph_.input_slots)].data)
                                              : nullptr;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int32_t* blocks = static_cast<const int32_t*>(table.data) + t * table.cols;
    const int64_t used = int64_t(pos[t]) / block_size_ + 1;  // <= table.cols: positions were checked
    const uint32_t stamp = next_stamp();
    for (int64_t j = 0; j < used; ++j) {
      if (blocks[j] < 0 || blocks[j] >= kv_blocks_)
        throw GraphError("KV block " + std::to_string(blocks[j]) + " out of range [0, " + std::to_string(kv_blocks_) + ")");
      if (stamp_[size_t(blocks[j])] == stamp)
        throw GraphError("block table of batch row " + std::to_string(t) + " repeats block " + std::to_string(blocks[j]));
      stamp_[size_t(blocks[j])] = stamp;
    }
    if (slots && int64_t(slots[t]) != int64_t(blocks[used - 1]) * block_size_ + pos[t] % block_size_)
      throw GraphError("KV slot of batch row " + std::to_string(t) + " is not its position's row in its block table");
  }
}

void Engine::reserve_memory() {
  std::lock_guard<std::mutex> lock(run_mutex_);
  state_.prefault();
  scratch_.prefault();
  inputs_.prefault();
}

void Engine::run(const int32_t* tokens, const int32_t* positions, int64_t n_tokens, const int32_t* out_ids,
                 int64_t n_outputs, const int32_t* slots, const int32_t* kv_table, int64_t kv_table_cols,
                 const int32_t* state_rows) {
  std::lock_guard<std::mutex> lock(run_mutex_);
  if (n_tokens < 1 || n_tokens > cfg_.max_tokens)
    throw GraphError("batch of " + std::to_string(n_tokens) + " tokens; this engine takes 1.." +
                     std::to_string(cfg_.max_tokens));
  if (n_outputs < 0 || n_outputs > cfg_.max_outputs)
    throw GraphError(std::to_string(n_outputs) + " outputs requested; at most " + std::to_string(cfg_.max_outputs));
  if (n_tokens > row_limit_[0].first || n_outputs > row_limit_[1].first) {
    const auto& l = n_tokens > row_limit_[0].first ? row_limit_[0] : row_limit_[1];
    throw GraphError("this graph reads tensor '" + l.second + "' at every row of the batch; it has " +
                     std::to_string(l.first) + " rows");
  }
  if (graph_.input_kv_table >= 0 && kv_table_cols < 1) throw GraphError("missing input: kv_table");
  auto bind = [&](int id, const int32_t* src, int64_t n, const char* what) {
    if (id < 0) return;
    if (!src) throw GraphError(std::string("missing input: ") + what);
    if (n > 0) std::memcpy(graph_.tensors[size_t(id)].data, src, size_t(n) * sizeof(int32_t));
  };
  bind(graph_.input_tokens, tokens, n_tokens, "tokens");
  bind(graph_.input_positions, positions, n_tokens, "positions");
  bind(graph_.input_out_ids, out_ids, n_outputs, "out_ids");
  bind(graph_.input_slots, slots, n_tokens, "slots");
  bind(graph_.input_state_rows, state_rows, n_tokens, "state_rows");
  if (graph_.input_kv_table >= 0) {
    const Tensor& table = graph_.tensors[size_t(graph_.input_kv_table)];
    if (kv_table_cols != table.cols)
      throw GraphError("block table has " + std::to_string(kv_table_cols) + " columns, expected " +
                       std::to_string(table.cols));
    bind(graph_.input_kv_table, kv_table, n_tokens * table.cols, "kv_table");
  }
  check_inputs(n_tokens, n_outputs);
  executor_->run(RunShape{n_tokens, n_outputs});
}

}  // namespace pyinfer
