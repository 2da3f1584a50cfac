#include "executor/executor.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <set>

namespace pyinfer {

std::vector<Segment> plan_segments(const Graph& graph, const std::vector<int>& placement,
                                   const std::vector<int>& buffer_of) {
  // 1. Node-level dependencies through buffers: read-after-write, write-after-read, write-after-write.
  const size_t nn = graph.nodes.size();
  const int n_buf = buffer_of.empty() ? 0 : *std::max_element(buffer_of.begin(), buffer_of.end()) + 1;
  std::vector<int> last_writer(size_t(n_buf), -1);
  std::vector<std::vector<int>> readers(static_cast<size_t>(n_buf));
  std::vector<std::vector<int>> node_deps(nn);
  for (size_t k = 0; k < nn; ++k) {
    const Node& n = graph.nodes[k];
    std::array<int, kMaxSources + 1> reads{};
    std::copy(n.src.begin(), n.src.end(), reads.begin());
    reads[kMaxSources] = n.guard.when_list;  // a guard reads its ActiveUnion's decision
    for (int s : reads) {
      if (s < 0 || buffer_of[size_t(s)] < 0) continue;
      const int b = buffer_of[size_t(s)];
      if (last_writer[size_t(b)] >= 0) node_deps[k].push_back(last_writer[size_t(b)]);
      readers[size_t(b)].push_back(int(k));
    }
    const int b = buffer_of[size_t(n.dst)];
    if (b < 0) continue;
    if (last_writer[size_t(b)] >= 0) node_deps[k].push_back(last_writer[size_t(b)]);
    for (int r : readers[size_t(b)])
      if (r != int(k)) node_deps[k].push_back(r);
    readers[size_t(b)].clear();
    last_writer[size_t(b)] = int(k);
  }
  // 2. Segments: a backend's consecutive nodes, cut before any node that needs another backend's segment
  //    the current one does not already wait for. So in CPU[norm] -> B[hot] -> CPU[cold, merge] the cold
  //    half starts with the hot half and only the merge waits (ggml's scheduler splits at such inputs too).
  std::vector<Segment> segs;
  std::vector<int> seg_of_node(nn, -1);
  std::vector<std::set<int>> deps;
  for (size_t k = 0; k < nn; ++k) {
    const int be = placement[k];
    std::set<int> need;
    for (int d : node_deps[k]) need.insert(seg_of_node[size_t(d)]);
    bool cut = segs.empty() || segs.back().backend != be;
    if (!cut) {
      const int cur = int(segs.size()) - 1;
      // A backend runs its segments in order: waiting for segment d covers its earlier segments too.
      auto waited = [&](int s) {
        for (int d : deps[size_t(cur)])
          if (segs[size_t(d)].backend == segs[size_t(s)].backend && d >= s) return true;
        return false;
      };
      for (int s : need)
        if (s != cur && segs[size_t(s)].backend != be && !waited(s)) cut = true;
    }
    if (cut) {
      segs.push_back(Segment{be, {}, {}});
      deps.emplace_back();
    }
    const int cur = int(segs.size()) - 1;
    segs.back().nodes.push_back(int(k));
    seg_of_node[k] = cur;
    for (int s : need)
      if (s != cur) deps[size_t(cur)].insert(s);
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
      const double t0 = timeline_on_ ? seconds_now() : 0.0;
      backends_[size_t(backend)]->compute(graph_, s.nodes, shape);
      if (timeline_on_) timeline_[i] = {t0 - run_start_, seconds_now() - run_start_};
      done_[i].store(gen, std::memory_order_release);
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

double Executor::seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Executor::set_timeline(bool on) {
  timeline_on_ = on;
  timeline_.assign(segments_.size(), {-1.0, -1.0});
}

void Executor::run(const RunShape& shape) {
  if (timeline_on_) {
    run_start_ = seconds_now();
    std::fill(timeline_.begin(), timeline_.end(), std::pair<double, double>{-1.0, -1.0});
  }
  if (!concurrent_) {
    for (size_t i = 0; i < segments_.size(); ++i) {
      const Segment& s = segments_[i];
      const double t0 = timeline_on_ ? seconds_now() : 0.0;
      backends_[size_t(s.backend)]->compute(graph_, s.nodes, shape);
      if (timeline_on_) timeline_[i] = {t0 - run_start_, seconds_now() - run_start_};
    }
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
