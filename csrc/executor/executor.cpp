#include "executor/executor.h"

#include <algorithm>
#include <array>
#include <set>

namespace pyinfer {

std::vector<Segment> plan_segments(const Graph& graph, const std::vector<int>& buffer_of) {
  std::vector<Segment> segs;
  std::vector<int> seg_of_node(graph.nodes.size(), -1);
  for (size_t k = 0; k < graph.nodes.size(); ++k) {
    const int be = graph.nodes[k].backend;
    if (segs.empty() || segs.back().backend != be) segs.push_back(Segment{be, {}, {}});
    segs.back().nodes.push_back(int(k));
    seg_of_node[k] = int(segs.size()) - 1;
  }
  // Per buffer: the last writer and the readers since it, as node indices.
  const int n_buf = buffer_of.empty() ? 0 : *std::max_element(buffer_of.begin(), buffer_of.end()) + 1;
  std::vector<int> last_writer(size_t(n_buf), -1);
  std::vector<std::vector<int>> readers;
  readers.resize(size_t(n_buf));
  std::vector<std::set<int>> deps(segs.size());
  auto depend = [&](size_t node, int other) {
    if (other >= 0 && seg_of_node[other] != seg_of_node[node]) deps[seg_of_node[node]].insert(seg_of_node[other]);
  };
  for (size_t k = 0; k < graph.nodes.size(); ++k) {
    const Node& n = graph.nodes[k];
    std::array<int, 7> reads{};
    std::copy(n.src.begin(), n.src.end(), reads.begin());
    reads[6] = n.when_list;  // a guard reads its ActiveUnion's decision
    for (int s : reads) {
      if (s < 0 || buffer_of[s] < 0) continue;
      depend(k, last_writer[buffer_of[s]]);
      readers[buffer_of[s]].push_back(int(k));
    }
    const int b = buffer_of[n.dst];
    if (b < 0) continue;
    depend(k, last_writer[b]);
    for (int r : readers[b]) depend(k, r);
    readers[b].clear();
    last_writer[b] = int(k);
  }
  for (size_t i = 0; i < segs.size(); ++i) segs[i].deps.assign(deps[i].begin(), deps[i].end());
  return segs;
}

Executor::Executor(const Graph& graph, std::vector<Backend*> backends, std::vector<Segment> segments)
    : graph_(graph), backends_(std::move(backends)), segments_(std::move(segments)) {
  std::set<int> used;
  for (const auto& s : segments_) used.insert(s.backend);
  concurrent_ = used.size() > 1;
  done_.reset(new std::atomic<uint64_t>[segments_.size() + 1]);
  for (size_t i = 0; i <= segments_.size(); ++i) done_[i].store(0);
  if (concurrent_)
    for (size_t b = 1; b < backends_.size(); ++b) drivers_.emplace_back(&Executor::drive, this, int(b));
}

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : drivers_) t.join();
}

void Executor::fail(std::exception_ptr e) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_) error_ = e;
  abort_.store(true, std::memory_order_release);
}

void Executor::run_segments_of(int backend, const RunShape& shape, uint64_t gen) {
  try {
    for (size_t i = 0; i < segments_.size(); ++i) {
      const Segment& s = segments_[i];
      if (s.backend != backend) continue;
      for (int d : s.deps)
        while (done_[d].load(std::memory_order_acquire) != gen) {
          if (abort_.load(std::memory_order_acquire)) return;
          std::this_thread::yield();
        }
      backends_[size_t(backend)]->compute(graph_, s.nodes, shape);
      done_[i].store(gen, std::memory_order_release);
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

void Executor::run(const RunShape& shape) {
  if (!concurrent_) {
    for (const auto& s : segments_) backends_[size_t(s.backend)]->compute(graph_, s.nodes, shape);
    return;
  }
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    gen = ++generation_;
    shape_ = shape;
    pending_ = int(drivers_.size());
    abort_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
  }
  wake_.notify_all();
  run_segments_of(0, shape, gen);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_cv_.wait(lock, [&] { return pending_ == 0; });
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

void Executor::drive(int backend) {
  uint64_t seen = 0;
  for (;;) {
    RunShape shape;
    uint64_t gen;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      gen = seen = generation_;
      shape = shape_;
    }
    run_segments_of(backend, shape, gen);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --pending_;
    }
    finished_cv_.notify_all();
  }
}

}  // namespace pyinfer
