// A few I/O threads that read a list of file ranges at once: the queue depth a single pread loop lacks
// when a decode step needs many small scattered reads (the neurons a predictor picked).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pyinfer {

struct ReadRange {
  uint8_t* dst;
  uint64_t offset;
  uint64_t bytes;
};

// Reads a list of file ranges with several requests in flight: io_uring (uring_reader.h) where the kernel
// allows it, else a few threads calling pread (ParallelReader).
class RangeReader {
 public:
  virtual ~RangeReader() = default;
  // Reads every range whole; throws std::runtime_error (naming the file) after all requests have stopped.
  virtual void read_all(const std::vector<ReadRange>& ranges) = 0;
  virtual const char* kind() const = 0;
};

class ParallelReader final : public RangeReader {
 public:
  // read(dst, offset, bytes) reads one range whole or throws; it must be safe to call from several threads.
  using ReadFn = std::function<void(uint8_t*, uint64_t, uint64_t)>;
  ParallelReader(ReadFn read, int n_threads);
  ~ParallelReader();
  ParallelReader(const ParallelReader&) = delete;
  ParallelReader& operator=(const ParallelReader&) = delete;

  // Reads every range (the caller's thread helps); rethrows the first failure after all have stopped.
  void read_all(const std::vector<ReadRange>& ranges) override;
  const char* kind() const override { return "pread"; }
  int queue_depth() const { return int(workers_.size()) + 1; }

 private:
  void work(uint64_t gen);
  void worker();

  ReadFn read_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_cv_;
  const std::vector<ReadRange>* job_ = nullptr;
  std::atomic<size_t> next_{0};
  size_t finished_ = 0;  // ranges done (guarded by mutex_)
  int busy_ = 0;         // workers inside the current job
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace pyinfer
