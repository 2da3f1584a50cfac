// A persistent pool of pthreads that run one function on every thread, with a spin barrier
// between graph nodes. Workers spin briefly between runs (decode steps come back within
// microseconds), then sleep so an idle engine costs no CPU. With more threads than the cores this
// process may run on, a spinning waiter would hold the very core the thread it waits for needs, so
// there every wait yields the core after a short spin.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace pyinfer {

class ThreadPool {
 public:
  using Task = void (*)(void* ctx, int ith, int nth);

  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_; }
  // More threads than cores_available(): waits yield instead of only spinning.
  bool oversubscribed() const { return oversubscribed_; }
  // Runs task(ctx, ith, n) on all threads; the caller is thread 0. Returns when all are done.
  void run(Task task, void* ctx);
  // Only from inside a task: returns when every thread has arrived.
  void barrier();

 private:
  void worker(int ith);
  // One step of a busy wait: a pause, and when oversubscribed a yield after every kYieldAfter pauses.
  void relax(int& spins) const;

  const int n_;
  const bool oversubscribed_;
  std::vector<std::thread> threads_;
  Task task_ = nullptr;
  void* ctx_ = nullptr;
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<int> finished_{0};
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<uint32_t> phase_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
};

// CPUs this process may run on (its affinity mask: a container's or taskset's limit), at least 1.
int cores_available();

}  // namespace pyinfer
