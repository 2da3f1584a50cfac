#include "offload/parallel_reader.h"

namespace pyinfer {

ParallelReader::ParallelReader(ReadFn read, int n_threads) : read_(std::move(read)) {
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back(&ParallelReader::worker, this);
}

ParallelReader::~ParallelReader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ParallelReader::work(uint64_t gen) {
  const std::vector<ReadRange>& ranges = *job_;
  size_t done = 0;
  std::exception_ptr failed;
  for (size_t i = next_.fetch_add(1); i < ranges.size(); i = next_.fetch_add(1)) {
    if (!failed) {
      try {
        read_(ranges[i].dst, ranges[i].offset, ranges[i].bytes);
      } catch (...) {
        failed = std::current_exception();  // the rest are counted, not read
      }
    }
    ++done;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  finished_ += done;
  if (failed && !error_) error_ = failed;
  (void)gen;
}

void ParallelReader::read_all(const std::vector<ReadRange>& ranges) {
  if (ranges.empty()) return;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &ranges;
    next_.store(0);
    finished_ = 0;
    error_ = nullptr;
    gen = ++generation_;
  }
  wake_.notify_all();
  work(gen);
  std::unique_lock<std::mutex> lock(mutex_);
  // Every range counted and no worker still inside this job (it reads job_ until it leaves).
  done_cv_.wait(lock, [&] { return finished_ == ranges.size() && busy_ == 0; });
  job_ = nullptr;
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void ParallelReader::worker() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || (job_ && generation_ != seen); });
    if (stop_) return;
    seen = generation_;
    ++busy_;
    lock.unlock();
    work(seen);
    lock.lock();
    --busy_;
    done_cv_.notify_all();
  }
}

}  // namespace pyinfer
