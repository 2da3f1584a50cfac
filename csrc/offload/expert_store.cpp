#include "offload/expert_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "graph/graph.h"
#include "offload/parallel_reader.h"
#include "offload/uring_reader.h"

namespace pyinfer {

namespace {

constexpr uint64_t kPage = 4096;  // O_DIRECT's alignment of buffer, offset and length

uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

uint64_t stride_of(const ExpertLayer& L, int p) {
  return L.expert_stride[size_t(p)] ? L.expert_stride[size_t(p)] : L.expert_bytes[size_t(p)];
}

// Every expert of every part starts on a page (an expert bundle file).
bool starts_on_pages(const ExpertLayer& L) {
  for (int p = 0; p < kExpertParts; ++p)
    if (L.file_offset[size_t(p)] % kPage || stride_of(L, p) % kPage) return false;
  return true;
}

// A part's room in a slot: its bytes rounded up to pages, and one page more for where they start in a page
// (none where every expert starts on one).
uint64_t part_span(const ExpertLayer& L, int p) {
  return round_up(L.expert_bytes[size_t(p)], kPage) + (starts_on_pages(L) ? 0 : kPage);
}

// Calls f(e) once for each distinct expert that route rows [0, n_tok) name (ids after the k weights, rows
// `stride` floats apart), marking it in `mark` (cleared by the caller); an id outside the layer's is refused.
template <class F>
void each_distinct_expert(int32_t n_expert, const float* route, int64_t n_tok, int32_t k, int64_t stride,
                          std::vector<uint8_t>& mark, F&& f) {
  for (int64_t t = 0; t < n_tok; ++t)
    for (int32_t s = 0; s < k; ++s) {
      const float v = route[t * stride + k + s];
      if (!(v >= 0.f && v < float(n_expert))) throw GraphError("a route names an expert outside the layer's");
      const int32_t e = int32_t(v);
      if (mark[size_t(e)]) continue;
      mark[size_t(e)] = 1;
      f(e);
    }
}

bool page_aligned(const ReadRange& r) {
  return ((reinterpret_cast<uintptr_t>(r.dst) | r.offset | r.bytes) % kPage) == 0;
}

// Anonymous memory for experts, faulted in now rather than by the reads that fill it. A page's first touch
// costs a fault (and in a VM a second one in the host); a 2.6 MB expert read into fresh pages takes 648 of them,
// and decode paid them for every cache slot on its first fill (a 12 GiB limit: 18,000 faults and 0.2 s a token
// waiting on read-ahead over the 32 tokens measured). Transparent huge pages where the kernel grants them
// (madvise mode): 512 times fewer faults and TLB entries for memory that only holds experts.
uint8_t* map_anonymous(uint64_t bytes, const std::string& what) {
  if (bytes == 0) return nullptr;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("cannot allocate " + std::to_string(bytes >> 20) + " MiB for " + what);
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);  // advice: refused on kernels without THP, and then 4 KiB pages as before
#endif
  auto* m = static_cast<volatile uint8_t*>(p);
  for (uint64_t o = 0; o < bytes; o += kPage) m[o] = 0;
  return static_cast<uint8_t*>(p);
}

}  // namespace

ExpertStore::ExpertStore(const std::string& path, std::vector<ExpertLayer> layers, int64_t cache_slots,
                         ExpertPolicy policy, int io_threads, bool use_uring, bool direct_io)
    : layers_(std::move(layers)), path_(path), policy_(policy), io_threads_(std::max(1, io_threads)) {
  if (cache_slots < 0) throw std::runtime_error("the expert cache needs a slot count >= 0");
  int32_t widest = 0;
  uint64_t resident_bytes = 0;
  for (const ExpertLayer& l : layers_) {
    if (l.n_expert < 1) throw std::runtime_error("every layer of an expert store has experts");
    std::array<uint64_t, kExpertParts> at{};
    uint64_t b = 0;
    for (int p = 0; p < kExpertParts; ++p) {
      if (l.expert_stride[size_t(p)] && l.expert_stride[size_t(p)] < l.expert_bytes[size_t(p)])
        throw std::runtime_error("an expert stride is shorter than the expert");
      at[size_t(p)] = b;
      b += part_span(l, p);
    }
    part_at_.push_back(at);
    slot_bytes_ = std::max(slot_bytes_, b);
    widest = std::max(widest, l.n_expert);
    for (int32_t e : l.resident)
      if (e < 0 || e >= l.n_expert) throw std::runtime_error("a resident expert id is out of range");
  }
  for (const ExpertLayer& l : layers_) resident_bytes += uint64_t(l.resident.size()) * slot_bytes_;
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error("cannot open " + path_ + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd_, &st) == 0) file_size_ = uint64_t(st.st_size);
  direct_fd_ = direct_io ? ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
  if (direct_fd_ >= 0) {  // some file systems open O_DIRECT and refuse the reads: try one page
    void* probe = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    const bool ok = probe != MAP_FAILED && ::pread(direct_fd_, probe, kPage, 0) >= 0;
    if (probe != MAP_FAILED) munmap(probe, kPage);
    if (!ok) {
      ::close(direct_fd_);
      direct_fd_ = -1;
    }
  }
  stats_.direct_io = direct_fd_ >= 0;
  use_uring_ = use_uring;
  try {
    io_ = make_reader();
    stats_.io_engine = io_->kind();
    tables_.resize(layers_.size());
    slot_of_.resize(layers_.size());
    chosen_.resize(layers_.size());
    uses_.resize(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l) {
      for (auto& t : tables_[l]) t.assign(size_t(layers_[l].n_expert), nullptr);
      slot_of_[l].assign(size_t(layers_[l].n_expert), -1);
      chosen_[l].assign(size_t(layers_[l].n_expert), 0);
      uses_[l].assign(size_t(layers_[l].n_expert), 0);
    }
    predicted_.resize(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l) predicted_[l].assign(size_t(layers_[l].n_expert), 0);
    has_prediction_.assign(layers_.size(), 0);
    seen_.assign(size_t(widest), 0);
    // Resident experts: read once, in one batch of reads.
    resident_map_ = resident_bytes;
    resident_ = map_anonymous(resident_map_, "resident experts");
    uint8_t* at = resident_;
    ranges_.clear();
    for (size_t l = 0; l < layers_.size(); ++l)
      for (int32_t e : layers_[l].resident) {
        if (slot_of_[l][size_t(e)] == -2) continue;  // listed twice
        slot_of_[l][size_t(e)] = -2;
        point(int(l), e, at);
        add_ranges(int(l), e, at, ranges_);
        at += slot_bytes_;
      }
    read_ranges();
    stats_.resident_bytes = resident_bytes;
    cache_map_ = uint64_t(cache_slots) * slot_bytes_;
    cache_ = map_anonymous(cache_map_, "the expert cache");
    slots_.resize(size_t(cache_slots));
    for (int64_t s = 0; s < cache_slots; ++s) slots_[size_t(s)].mem = cache_ + uint64_t(s) * slot_bytes_;
    stats_.cache_bytes = cache_map_;
    stats_.cache_slots = cache_slots;
  } catch (...) {
    io_.reset();
    retired_.clear();  // before the memory a broken ring may still be reading into
    if (resident_) munmap(resident_, resident_map_);
    if (cache_) munmap(cache_, cache_map_);
    ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
    throw;
  }
  // The page cache must not keep a second copy of what was just read into RAM of our own.
  if (direct_fd_ < 0) posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
}

ExpertStore::~ExpertStore() {
  if (pf_thread_.joinable()) {  // a read-ahead in flight finishes first: it reads into the cache unmapped below
    {
      std::lock_guard<std::mutex> lock(pf_mutex_);
      pf_stop_ = true;
    }
    pf_cv_.notify_all();
    pf_thread_.join();
  }
  pf_io_.reset();
  pf_retired_.clear();
  io_.reset();
  retired_.clear();
  if (resident_) munmap(resident_, resident_map_);
  if (cache_) munmap(cache_, cache_map_);
  if (fd_ >= 0) ::close(fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
}

void ExpertStore::point(int layer, int expert, const uint8_t* base) {
  const ExpertLayer& L = layers_[size_t(layer)];
  for (int p = 0; p < kExpertParts; ++p) {
    const uint64_t lead = (L.file_offset[size_t(p)] + uint64_t(expert) * stride_of(L, p)) % kPage;  // in its page
    tables_[size_t(layer)][size_t(p)][size_t(expert)] = base ? base + part_at_[size_t(layer)][size_t(p)] + lead : nullptr;
  }
}

void ExpertStore::add_ranges(int layer, int expert, uint8_t* base, std::vector<ReadRange>& out) const {
  const ExpertLayer& L = layers_[size_t(layer)];
  for (int p = 0; p < kExpertParts; ++p) {
    const uint64_t off = part_at_[size_t(layer)][size_t(p)];
    const uint64_t n = L.expert_bytes[size_t(p)];
    const uint64_t at = L.file_offset[size_t(p)] + uint64_t(expert) * stride_of(L, p);
    const uint64_t lead = at % kPage;
    const uint64_t whole = round_up(lead + n, kPage);
    ReadRange r = direct_fd_ >= 0 && at - lead + whole <= file_size_
        ? ReadRange{base + off, at - lead, whole}  // the pages around it, straight into the slot
        : ReadRange{base + off + lead, at, n};     // exactly its bytes (no O_DIRECT, or the file's last page)
    ReadRange* last = p > 0 ? &out.back() : nullptr;
    if (last && last->offset + last->bytes == r.offset && last->dst + last->bytes == r.dst &&
        page_aligned(*last) == page_aligned(r))
      last->bytes += r.bytes;  // side by side in the file as in the slot (an expert bundle): one read
    else
      out.push_back(r);
  }
}

void ExpertStore::read_exact(int fd, uint8_t* dst, uint64_t offset, uint64_t bytes) const {
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(fd, dst + done, bytes - done, off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw std::runtime_error("reading experts from " + path_ + ": " + std::strerror(errno));
    if (got == 0) throw std::runtime_error(path_ + " is shorter than its expert tensors (truncated?)");
    done += uint64_t(got);
  }
}

std::unique_ptr<RangeReader> ExpertStore::make_reader() {
  const int fd = direct_fd_ >= 0 ? direct_fd_ : fd_;  // the readers get page-aligned ranges only (read_with)
  if (use_uring_) {
    try {
      return std::make_unique<UringReader>(fd, unsigned(io_threads_), path_);
    } catch (const std::runtime_error&) {
      // refused by this kernel: pread threads
    }
  }
  return std::make_unique<ParallelReader>(
      [this, fd](uint8_t* dst, uint64_t off, uint64_t n) { read_exact(fd, dst, off, n); }, io_threads_);
}

void ExpertStore::read_with(std::unique_ptr<RangeReader>& io, std::vector<std::unique_ptr<RangeReader>>& retired,
                            const std::vector<ReadRange>& ranges) {
  if (ranges.empty()) return;
  if (direct_fd_ >= 0 && !std::all_of(ranges.begin(), ranges.end(), page_aligned)) {
    // Exact ranges (an expert in the file's last page) go through the page cache here; the rest as usual.
    std::vector<ReadRange> aligned;
    for (const ReadRange& r : ranges) {
      if (page_aligned(r)) {
        aligned.push_back(r);
      } else {
        read_exact(fd_, r.dst, r.offset, r.bytes);
        posix_fadvise(fd_, off_t(r.offset), off_t(r.bytes), POSIX_FADV_DONTNEED);  // no second copy kept
      }
    }
    read_with(io, retired, aligned);
    return;
  }
  try {
    io->read_all(ranges);
  } catch (...) {
    auto* ring = dynamic_cast<UringReader*>(io.get());
    if (!ring || !ring->broken()) throw;
    retired.push_back(std::move(io));  // reads may still be in flight into buffers that live on
    const int fd = direct_fd_ >= 0 ? direct_fd_ : fd_;
    io = std::make_unique<ParallelReader>(
        [this, fd](uint8_t* dst, uint64_t off, uint64_t n) { read_exact(fd, dst, off, n); }, io_threads_);
    io->read_all(ranges);
  }
}

void ExpertStore::read_ranges() {
  try {
    read_with(io_, retired_, ranges_);
  } catch (...) {
    if (io_) stats_.io_engine = io_->kind();  // a fallback reader may have taken the broken ring's place
    throw;
  }
  stats_.io_engine = io_->kind();
}

int64_t ExpertStore::pick_victim(uint64_t now) const {
  int64_t victim = -1;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& c = slots_[i];
    if (c.layer < 0) return int64_t(i);  // empty (its `used` may equal `now` before any fetch)
    if (c.used == now) continue;
    if (victim < 0) { victim = int64_t(i); continue; }
    const Slot& v = slots_[size_t(victim)];
    const bool better = policy_ == ExpertPolicy::Lfu
        ? std::make_pair(uses_[size_t(c.layer)][size_t(c.expert)], c.used) <
              std::make_pair(uses_[size_t(v.layer)][size_t(v.expert)], v.used)
        : c.used < v.used;
    if (better) victim = int64_t(i);
  }
  return victim;
}

void ExpertStore::take_slot(int64_t slot, int layer, int expert, uint64_t now) {
  Slot& v = slots_[size_t(slot)];
  if (v.layer >= 0) {
    slot_of_[size_t(v.layer)][size_t(v.expert)] = -1;
    point(v.layer, v.expert, nullptr);
    ++stats_.evictions;
  }
  v.layer = layer;
  v.expert = expert;
  v.used = now;
  v.ahead = false;
  slot_of_[size_t(layer)][size_t(expert)] = int32_t(slot);
  point(layer, expert, v.mem);
  const size_t first = ranges_.size();
  add_ranges(layer, expert, v.mem, ranges_);
  for (size_t i = first; i < ranges_.size(); ++i) stats_.bytes_read += ranges_[i].bytes;  // what the disk reads
}

void ExpertStore::forget(const std::vector<ReadRange>& ranges) {
  for (const ReadRange& r : ranges)
    for (Slot& c : slots_)
      if (c.mem <= r.dst && r.dst < c.mem + slot_bytes_ && c.layer >= 0) {
        slot_of_[size_t(c.layer)][size_t(c.expert)] = -1;
        point(c.layer, c.expert, nullptr);
        c.layer = c.expert = -1;
        c.ahead = false;
      }
}

void ExpertStore::fetch(int layer, const float* route, int64_t n_tok, int32_t k, int64_t stride) {
  if (layer < 0 || layer >= n_layers()) throw std::runtime_error("no such layer in the expert store");
  wait_prefetch();  // its slots are settled (read, or forgotten) before anything looks at them
  const ExpertLayer& L = layers_[size_t(layer)];
  const uint64_t now = ++clock_;
  ++stats_.fetches;
  std::fill(seen_.begin(), seen_.begin() + L.n_expert, 0);
  // Pass 1: mark what this run needs, so a slot another of its experts holds is never taken.
  std::vector<int32_t>& slot_of = slot_of_[size_t(layer)];
  const bool predicted = has_prediction_[size_t(layer)] != 0;
  has_prediction_[size_t(layer)] = 0;
  int32_t needed = 0;
  each_distinct_expert(L.n_expert, route, n_tok, k, stride, seen_, [&](int32_t e) {
    ++needed;
    ++chosen_[size_t(layer)][size_t(e)];
    ++uses_[size_t(layer)][size_t(e)];
    if (predicted) {
      ++stats_.predicted;
      stats_.predicted_right += predicted_[size_t(layer)][size_t(e)];
    }
    const int32_t slot = slot_of[size_t(e)];
    if (slot >= 0) {
      Slot& c = slots_[size_t(slot)];
      c.used = now;
      if (c.ahead) ++stats_.prefetch_used;
      c.ahead = false;
    }
  });
  stats_.requests += uint64_t(needed);
  for (Slot& c : slots_)  // read-ahead for this layer that this run did not choose was not used
    if (c.layer == layer) c.ahead = false;
  // Room first: a run that needs more slots than are free of its own experts changes nothing and fails.
  int64_t misses = 0, free_slots = 0;
  for (int32_t e = 0; e < L.n_expert; ++e) misses += seen_[size_t(e)] && slot_of[size_t(e)] == -1;
  for (const Slot& c : slots_) free_slots += c.used != now || c.layer < 0;
  if (misses > free_slots)
    throw GraphError("the expert cache has " + std::to_string(slots_.size()) + " slots; one run of layer " +
                     std::to_string(layer) + " needs " + std::to_string(needed) + " experts outside RAM");
  // Pass 2: hits, and a slot for every miss (free, else the policy's victim among slots this run does not use).
  ranges_.clear();
  for (int32_t e = 0; e < L.n_expert; ++e) {
    if (!seen_[size_t(e)]) continue;
    const int32_t slot = slot_of[size_t(e)];
    if (slot == -2) { ++stats_.resident_hits; continue; }
    if (slot >= 0) { ++stats_.cache_hits; continue; }
    take_slot(pick_victim(now), layer, e, now);  // the room check above leaves a victim for every miss
    ++stats_.misses;
  }
  if (ranges_.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    read_ranges();
  } catch (...) {  // what was being read is not valid: forget it, so a later run reads it again
    forget(ranges_);
    throw;
  }
  if (direct_fd_ < 0)
    for (const ReadRange& r : ranges_) posix_fadvise(fd_, off_t(r.offset), off_t(r.bytes), POSIX_FADV_DONTNEED);
  stats_.read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ExpertStore::prefetch(int layer, const float* route, int64_t n_tok, int32_t k, int64_t stride) {
  if (layer < 0 || layer >= n_layers()) throw std::runtime_error("no such layer in the expert store");
  wait_prefetch();
  const ExpertLayer& L = layers_[size_t(layer)];
  std::vector<uint8_t>& named = predicted_[size_t(layer)];
  std::fill(named.begin(), named.end(), 0);
  want_.clear();
  each_distinct_expert(L.n_expert, route, n_tok, k, stride, named, [&](int32_t e) {
    if (slot_of_[size_t(layer)][size_t(e)] == -1) want_.push_back(e);
  });
  has_prediction_[size_t(layer)] = 1;
  if (want_.empty()) return;
  if (!pf_thread_.joinable()) {  // before any slot changes hands: a failure here leaves the cache as it was
    pf_io_ = make_reader();
    pf_thread_ = std::thread([this] { prefetch_loop(); });
  }
  // Slots the last fetch's run is computing with keep their experts (used == clock_); read-ahead takes the
  // others' places in the policy's order, and stops when none is left.
  const uint64_t now = clock_;
  ranges_.clear();
  for (int32_t e : want_) {
    const int64_t victim = pick_victim(now);
    if (victim < 0) break;
    const uint64_t before = stats_.bytes_read;
    take_slot(victim, layer, e, now);
    slots_[size_t(victim)].ahead = true;
    stats_.prefetch_bytes += stats_.bytes_read - before;
    ++stats_.prefetched;
  }
  if (ranges_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(pf_mutex_);
    pf_ranges_.swap(ranges_);
    pf_queued_ = true;
    pf_done_ = false;
  }
  pf_cv_.notify_all();
}

void ExpertStore::wait_prefetch() {
  if (!pf_thread_.joinable()) return;
  std::unique_lock<std::mutex> lock(pf_mutex_);
  if (!pf_queued_) return;
  const auto t0 = std::chrono::steady_clock::now();
  pf_cv_.wait(lock, [this] { return pf_done_; });
  stats_.prefetch_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  pf_queued_ = false;
  if (pf_error_) {  // those slots hold nothing valid: their experts are read again when chosen
    pf_error_ = nullptr;
    ++stats_.prefetch_failures;
    forget(pf_ranges_);
  }
  pf_ranges_.clear();
}

void ExpertStore::prefetch_loop() {
  std::unique_lock<std::mutex> lock(pf_mutex_);
  for (;;) {
    pf_cv_.wait(lock, [this] { return pf_stop_ || (pf_queued_ && !pf_done_); });
    if (pf_stop_) return;
    lock.unlock();  // the ranges are this thread's until it says done
    std::exception_ptr error;
    try {
      read_with(pf_io_, pf_retired_, pf_ranges_);
      if (direct_fd_ < 0)
        for (const ReadRange& r : pf_ranges_) posix_fadvise(fd_, off_t(r.offset), off_t(r.bytes), POSIX_FADV_DONTNEED);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    pf_error_ = error;
    pf_done_ = true;
    pf_cv_.notify_all();
  }
}

void ExpertStore::reset_stats() {
  const ExpertStoreStats keep = stats_;
  stats_ = ExpertStoreStats{};
  stats_.resident_bytes = keep.resident_bytes;
  stats_.cache_bytes = keep.cache_bytes;
  stats_.cache_slots = keep.cache_slots;
  stats_.io_engine = keep.io_engine;
  stats_.direct_io = keep.direct_io;
  for (auto& c : chosen_) std::fill(c.begin(), c.end(), 0);
}

}  // namespace pyinfer
