// Scattered reads through io_uring, straight on the system calls (no liburing): one submission ring, up to
// `depth` reads in flight from a single thread. The kernel may refuse io_uring (too old, or a seccomp policy
// in a container): the constructor throws and the neuron store reads with pread threads instead.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "offload/parallel_reader.h"

struct io_uring_sqe;
struct io_uring_cqe;

namespace pyinfer {

class UringReader final : public RangeReader {
 public:
  // fd stays the caller's. Throws std::runtime_error when io_uring is unavailable.
  UringReader(int fd, unsigned depth, std::string path);
  ~UringReader() override;
  UringReader(const UringReader&) = delete;
  UringReader& operator=(const UringReader&) = delete;

  void read_all(const std::vector<ReadRange>& ranges) override;
  const char* kind() const override { return "io_uring"; }
  // Whether this build has io_uring at all (the kernel header was found at build time).
  static bool compiled();
  // A failed io_uring_enter leaves reads in flight: the ring is never used again (the store reads with pread).
  bool broken() const { return broken_; }

 private:
  void submit(size_t range, const ReadRange& r);
  void release();
  int enter(unsigned to_submit, unsigned wait);

  int fd_;
  unsigned depth_;
  std::string path_;
  int ring_ = -1;
  void* sq_map_ = nullptr;
  size_t sq_map_bytes_ = 0;
  void* cq_map_ = nullptr;  // == sq_map_ when the kernel maps both rings at once
  size_t cq_map_bytes_ = 0;
  io_uring_sqe* sqes_ = nullptr;
  size_t sqes_bytes_ = 0;
  unsigned *sq_head_ = nullptr, *sq_tail_ = nullptr, *sq_mask_ = nullptr, *sq_array_ = nullptr;
  unsigned *cq_head_ = nullptr, *cq_tail_ = nullptr, *cq_mask_ = nullptr;
  io_uring_cqe* cqes_ = nullptr;
  std::vector<uint64_t> done_;     // per range: bytes read so far (short reads are resubmitted)
  std::vector<size_t> pending_;    // ranges waiting for a free slot
  bool broken_ = false;
};

}  // namespace pyinfer
