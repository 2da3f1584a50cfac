#include "offload/uring_reader.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

#if defined(__linux__) && __has_include(<linux/io_uring.h>)
#define PYINFER_HAVE_URING 1
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace pyinfer {

#ifdef PYINFER_HAVE_URING

namespace {

template <typename T>
T* at(void* base, uint32_t offset) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(base) + offset);
}

}  // namespace

bool UringReader::compiled() { return true; }

UringReader::UringReader(int fd, unsigned depth, std::string path) : fd_(fd), depth_(depth), path_(std::move(path)) {
  if (depth_ < 1 || depth_ > 256) throw std::invalid_argument("io_uring depth must be 1..256");
  io_uring_params p;
  std::memset(&p, 0, sizeof p);
  ring_ = int(syscall(__NR_io_uring_setup, depth_, &p));
  if (ring_ < 0) throw std::runtime_error(std::string("io_uring unavailable: ") + std::strerror(errno));
  auto fail = [&](const char* what) {
    const int err = errno;
    release();  // the destructor does not run for a constructor that throws
    throw std::runtime_error(std::string("io_uring ") + what + ": " + std::strerror(err));
  };
  sq_map_bytes_ = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  cq_map_bytes_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
  const bool single = p.features & IORING_FEAT_SINGLE_MMAP;
  if (single) sq_map_bytes_ = cq_map_bytes_ = std::max(sq_map_bytes_, cq_map_bytes_);
  sq_map_ = mmap(nullptr, sq_map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_, IORING_OFF_SQ_RING);
  if (sq_map_ == MAP_FAILED) {
    sq_map_ = nullptr;
    fail("ring mmap");
  }
  if (single) {
    cq_map_ = sq_map_;
  } else {
    cq_map_ = mmap(nullptr, cq_map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_,
                   IORING_OFF_CQ_RING);
    if (cq_map_ == MAP_FAILED) {
      cq_map_ = nullptr;
      fail("completion ring mmap");
    }
  }
  sqes_bytes_ = p.sq_entries * sizeof(io_uring_sqe);
  void* sqes = mmap(nullptr, sqes_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_, IORING_OFF_SQES);
  if (sqes == MAP_FAILED) fail("entries mmap");
  sqes_ = static_cast<io_uring_sqe*>(sqes);
  sq_head_ = at<unsigned>(sq_map_, p.sq_off.head);
  sq_tail_ = at<unsigned>(sq_map_, p.sq_off.tail);
  sq_mask_ = at<unsigned>(sq_map_, p.sq_off.ring_mask);
  sq_array_ = at<unsigned>(sq_map_, p.sq_off.array);
  cq_head_ = at<unsigned>(cq_map_, p.cq_off.head);
  cq_tail_ = at<unsigned>(cq_map_, p.cq_off.tail);
  cq_mask_ = at<unsigned>(cq_map_, p.cq_off.ring_mask);
  cqes_ = at<io_uring_cqe>(cq_map_, p.cq_off.cqes);
  depth_ = std::min(depth_, p.sq_entries);
}

UringReader::~UringReader() { release(); }

void UringReader::release() {
  if (sqes_) munmap(sqes_, sqes_bytes_);
  if (cq_map_ && cq_map_ != sq_map_) munmap(cq_map_, cq_map_bytes_);
  if (sq_map_) munmap(sq_map_, sq_map_bytes_);
  if (ring_ >= 0) close(ring_);
  sqes_ = nullptr;
  cq_map_ = sq_map_ = nullptr;
  ring_ = -1;
}

int UringReader::enter(unsigned to_submit, unsigned wait) {
  for (;;) {
    const long r = syscall(__NR_io_uring_enter, ring_, to_submit, wait, wait ? IORING_ENTER_GETEVENTS : 0, nullptr, 0);
    if (r >= 0) return int(r);
    if (errno != EINTR)
      throw std::runtime_error("reading bundle file " + path_ + ": io_uring_enter: " + std::strerror(errno));
  }
}

void UringReader::submit(size_t range, const ReadRange& r) {
  const unsigned tail = __atomic_load_n(sq_tail_, __ATOMIC_RELAXED);  // only this thread writes the tail
  const unsigned slot = tail & *sq_mask_;
  io_uring_sqe& e = sqes_[slot];
  std::memset(&e, 0, sizeof e);
  e.opcode = IORING_OP_READ;
  e.fd = fd_;
  e.addr = reinterpret_cast<uint64_t>(r.dst + done_[range]);
  e.len = uint32_t(r.bytes - done_[range]);
  e.off = r.offset + done_[range];
  e.user_data = range;
  sq_array_[slot] = slot;
  __atomic_store_n(sq_tail_, tail + 1, __ATOMIC_RELEASE);  // the kernel sees the entry before the new tail
}

void UringReader::read_all(const std::vector<ReadRange>& ranges) {
  if (broken_) throw std::runtime_error("reading bundle file " + path_ + ": the io_uring ring failed earlier");
  if (ranges.empty()) return;
  done_.assign(ranges.size(), 0);
  pending_.clear();
  for (size_t i = ranges.size(); i-- > 0;) pending_.push_back(i);  // popped from the back: in order
  unsigned in_flight = 0, queued = 0;
  std::string error;
  while (in_flight > 0 || (!pending_.empty() && error.empty())) {
    while (error.empty() && !pending_.empty() && in_flight + queued < depth_) {
      submit(pending_.back(), ranges[pending_.back()]);
      pending_.pop_back();
      ++queued;
    }
    try {
      enter(queued, 1);  // the kernel consumes every queued entry or fails the call
    } catch (...) {
      broken_ = true;  // reads may still be in flight: this ring is not used again
      throw;
    }
    in_flight += queued;
    queued = 0;
    unsigned head = __atomic_load_n(cq_head_, __ATOMIC_RELAXED);
    const unsigned tail = __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE);
    for (; head != tail; ++head) {
      const io_uring_cqe& c = cqes_[head & *cq_mask_];
      const size_t i = size_t(c.user_data);
      --in_flight;
      if (c.res == -EINTR || c.res == -EAGAIN) {
        pending_.push_back(i);
      } else if (c.res < 0) {
        if (error.empty()) error = "reading bundle file " + path_ + ": " + std::strerror(-c.res);
      } else if (c.res == 0) {
        if (error.empty()) error = path_ + " is shorter than its layout (truncated?)";
      } else {
        done_[i] += uint64_t(c.res);
        if (done_[i] < ranges[i].bytes) pending_.push_back(i);  // a short read: the rest, again
      }
    }
    __atomic_store_n(cq_head_, head, __ATOMIC_RELEASE);
  }
  if (!error.empty()) throw std::runtime_error(error);
}

#else  // no io_uring in this build

bool UringReader::compiled() { return false; }
UringReader::UringReader(int fd, unsigned depth, std::string path) : fd_(fd), depth_(depth), path_(std::move(path)) {
  throw std::runtime_error("io_uring unavailable: not built in");
}
UringReader::~UringReader() = default;
void UringReader::release() {}
void UringReader::read_all(const std::vector<ReadRange>&) {}
void UringReader::submit(size_t, const ReadRange&) {}
int UringReader::enter(unsigned, unsigned) { return 0; }

#endif

}  // namespace pyinfer
