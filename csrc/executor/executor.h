// Splits a graph into per-backend segments with dependencies, then runs them: a single-backend
// graph runs inline on the caller; otherwise every backend gets a driver thread and segments of
// different backends overlap wherever the dependencies allow. An exception in any segment stops the
// others at their next wait and is rethrown by run() on the caller's thread.
#pragma once
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "executor/backend.h"

namespace pyinfer {

struct Segment {
  int backend = 0;
  std::vector<int> nodes;
  std::vector<int> deps;  // segments that must finish first
};

// `placement[k]`: node k's backend. `buffer_of[t]` names the memory a tensor lives in, so reuse of one
// buffer by two tensors orders their readers and writers (write-after-read hazards across backends).
std::vector<Segment> plan_segments(const Graph& graph, const std::vector<int>& placement,
                                   const std::vector<int>& buffer_of);

class Executor {
 public:
  Executor(const Graph& graph, std::vector<Backend*> backends, std::vector<Segment> segments);
  ~Executor();
  void run(const RunShape& shape);
  const std::vector<Segment>& segments() const { return segments_; }
  // Per segment of the last run: (start, end) seconds from the run's start, (-1, -1) where it did not run.
  // Between runs only; recording costs two clock reads per segment.
  void set_timeline(bool on);
  const std::vector<std::pair<double, double>>& timeline() const { return timeline_; }

 private:
  void drive(int backend);
  void run_segments_of(int backend, const RunShape& shape, uint64_t gen);
  void fail(std::exception_ptr e);
  static double seconds_now();

  const Graph& graph_;
  std::vector<Backend*> backends_;
  std::vector<Segment> segments_;
  bool concurrent_ = false;
  std::unique_ptr<std::atomic<uint64_t>[]> done_;  // generation in which each segment finished
  std::vector<std::thread> drivers_;
  std::mutex mutex_;
  std::condition_variable wake_, finished_cv_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  RunShape shape_;
  std::atomic<bool> abort_{false};  // a segment failed in this run: the others stop waiting
  std::exception_ptr error_;        // the first failure (guarded by mutex_)
  bool timeline_on_ = false;
  double run_start_ = 0.0;
  std::vector<std::pair<double, double>> timeline_;  // each entry written by its segment's driver only
};

}  // namespace pyinfer
