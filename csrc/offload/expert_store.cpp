#include "offload/expert_store.h"

#include <fcntl.h>
#include <sys/mman.h>
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

constexpr uint64_t kAlign = 64;  // each part of a slot starts on its own cache line

uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

uint8_t* map_anonymous(uint64_t bytes, const std::string& what) {
  if (bytes == 0) return nullptr;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("cannot allocate " + std::to_string(bytes >> 20) + " MiB for " + what);
  return static_cast<uint8_t*>(p);
}

}  // namespace

ExpertStore::ExpertStore(const std::string& path, std::vector<ExpertLayer> layers, int64_t cache_slots,
                         ExpertPolicy policy, int io_threads, bool use_uring)
    : layers_(std::move(layers)), path_(path), policy_(policy), io_threads_(std::max(1, io_threads)) {
  if (cache_slots < 0) throw std::runtime_error("the expert cache needs a slot count >= 0");
  int32_t widest = 0;
  uint64_t resident_bytes = 0;
  for (const ExpertLayer& l : layers_) {
    if (l.n_expert < 1) throw std::runtime_error("every layer of an expert store has experts");
    uint64_t b = 0;
    for (uint64_t e : l.expert_bytes) b += round_up(e, kAlign);
    slot_bytes_ = std::max(slot_bytes_, b);
    widest = std::max(widest, l.n_expert);
    for (int32_t e : l.resident)
      if (e < 0 || e >= l.n_expert) throw std::runtime_error("a resident expert id is out of range");
  }
  for (const ExpertLayer& l : layers_) resident_bytes += uint64_t(l.resident.size()) * slot_bytes_;
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error("cannot open " + path_ + ": " + std::strerror(errno));
  try {
    if (use_uring) {
      try {
        io_ = std::make_unique<UringReader>(fd_, unsigned(io_threads_), path_);
      } catch (const std::runtime_error&) {
        io_.reset();  // refused by this kernel: pread threads
      }
    }
    if (!io_)
      io_ = std::make_unique<ParallelReader>(
          [this](uint8_t* dst, uint64_t off, uint64_t n) { read_exact(dst, off, n); }, io_threads_);
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
        uint64_t off = 0;
        for (int p = 0; p < kExpertParts; ++p) {
          const uint64_t n = layers_[l].expert_bytes[size_t(p)];
          ranges_.push_back({at + off, layers_[l].file_offset[size_t(p)] + uint64_t(e) * n, n});
          off += round_up(n, kAlign);
        }
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
    throw;
  }
  // The page cache must not keep a second copy of what was just read into RAM of our own.
  posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
}

ExpertStore::~ExpertStore() {
  io_.reset();
  retired_.clear();
  if (resident_) munmap(resident_, resident_map_);
  if (cache_) munmap(cache_, cache_map_);
  if (fd_ >= 0) ::close(fd_);
}

void ExpertStore::point(int layer, int expert, const uint8_t* base) {
  uint64_t off = 0;
  for (int p = 0; p < kExpertParts; ++p) {
    tables_[size_t(layer)][size_t(p)][size_t(expert)] = base ? base + off : nullptr;
    off += round_up(layers_[size_t(layer)].expert_bytes[size_t(p)], kAlign);
  }
}

void ExpertStore::read_exact(uint8_t* dst, uint64_t offset, uint64_t bytes) const {
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(fd_, dst + done, bytes - done, off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw std::runtime_error("reading experts from " + path_ + ": " + std::strerror(errno));
    if (got == 0) throw std::runtime_error(path_ + " is shorter than its expert tensors (truncated?)");
    done += uint64_t(got);
  }
}

void ExpertStore::read_ranges() {
  if (ranges_.empty()) return;
  try {
    io_->read_all(ranges_);
  } catch (...) {
    auto* ring = dynamic_cast<UringReader*>(io_.get());
    if (!ring || !ring->broken()) throw;
    retired_.push_back(std::move(io_));  // reads may still be in flight into buffers that live on
    io_ = std::make_unique<ParallelReader>(
        [this](uint8_t* dst, uint64_t off, uint64_t n) { read_exact(dst, off, n); }, io_threads_);
    stats_.io_engine = io_->kind();
    io_->read_all(ranges_);
  }
}

void ExpertStore::fetch(int layer, const float* route, int64_t n_tok, int32_t k, int64_t stride) {
  if (layer < 0 || layer >= n_layers()) throw std::runtime_error("no such layer in the expert store");
  const ExpertLayer& L = layers_[size_t(layer)];
  const uint64_t now = ++clock_;
  ++stats_.fetches;
  std::fill(seen_.begin(), seen_.begin() + L.n_expert, 0);
  // Pass 1: mark what this run needs, so a slot another of its experts holds is never taken.
  std::vector<int32_t>& slot_of = slot_of_[size_t(layer)];
  int32_t needed = 0;
  for (int64_t t = 0; t < n_tok; ++t)
    for (int32_t s = 0; s < k; ++s) {
      const float v = route[t * stride + k + s];
      if (!(v >= 0.f && v < float(L.n_expert))) throw GraphError("a route names an expert outside the layer's");
      const int32_t e = int32_t(v);
      if (seen_[size_t(e)]) continue;
      seen_[size_t(e)] = 1;
      ++needed;
      ++chosen_[size_t(layer)][size_t(e)];
      ++uses_[size_t(layer)][size_t(e)];
      const int32_t slot = slot_of[size_t(e)];
      if (slot >= 0) slots_[size_t(slot)].used = now;
    }
  stats_.requests += uint64_t(needed);
  // Room first: a run that needs more slots than are free of its own experts changes nothing and fails.
  int64_t misses = 0, free_slots = 0;
  for (int32_t e = 0; e < L.n_expert; ++e) misses += seen_[size_t(e)] && slot_of[size_t(e)] == -1;
  for (const Slot& c : slots_) free_slots += c.used != now;
  if (misses > free_slots)
    throw GraphError("the expert cache has " + std::to_string(slots_.size()) + " slots; one run of layer " +
                     std::to_string(layer) + " needs " + std::to_string(needed) + " experts outside RAM");
  // Pass 2: hits, and a slot for every miss.
  ranges_.clear();
  for (int32_t e = 0; e < L.n_expert; ++e) {
    if (!seen_[size_t(e)]) continue;
    const int32_t slot = slot_of[size_t(e)];
    if (slot == -2) { ++stats_.resident_hits; continue; }
    if (slot >= 0) { ++stats_.cache_hits; continue; }
    // A miss: a free slot, else the victim the policy picks among slots this run does not use.
    int64_t victim = -1;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& c = slots_[i];
      if (c.used == now) continue;
      if (c.layer < 0) { victim = int64_t(i); break; }
      if (victim < 0) { victim = int64_t(i); continue; }
      const Slot& v = slots_[size_t(victim)];
      const bool better = policy_ == ExpertPolicy::Lfu
          ? std::make_pair(uses_[size_t(c.layer)][size_t(c.expert)], c.used) <
                std::make_pair(uses_[size_t(v.layer)][size_t(v.expert)], v.used)
          : c.used < v.used;
      if (better) victim = int64_t(i);
    }
    if (victim < 0)
      throw GraphError("the expert cache has " + std::to_string(slots_.size()) + " slots; one run of layer " +
                               std::to_string(layer) + " needs " + std::to_string(needed) + " experts outside RAM");
    Slot& v = slots_[size_t(victim)];
    if (v.layer >= 0) {
      slot_of_[size_t(v.layer)][size_t(v.expert)] = -1;
      point(v.layer, v.expert, nullptr);
      ++stats_.evictions;
    }
    v.layer = layer;
    v.expert = e;
    v.used = now;
    slot_of[size_t(e)] = int32_t(victim);
    point(layer, e, v.mem);
    uint64_t off = 0;
    for (int p = 0; p < kExpertParts; ++p) {
      const uint64_t n = L.expert_bytes[size_t(p)];
      ranges_.push_back({v.mem + off, L.file_offset[size_t(p)] + uint64_t(e) * n, n});
      off += round_up(n, kAlign);
      stats_.bytes_read += n;
    }
    ++stats_.misses;
  }
  if (ranges_.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    read_ranges();
  } catch (...) {  // what was being read is not valid: forget it, so a later run reads it again
    for (const ReadRange& r : ranges_)
      for (Slot& c : slots_)
        if (c.mem <= r.dst && r.dst < c.mem + slot_bytes_ && c.layer >= 0) {
          slot_of_[size_t(c.layer)][size_t(c.expert)] = -1;
          point(c.layer, c.expert, nullptr);
          c.layer = c.expert = -1;
        }
    throw;
  }
  for (const ReadRange& r : ranges_) posix_fadvise(fd_, off_t(r.offset), off_t(r.bytes), POSIX_FADV_DONTNEED);
  stats_.read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ExpertStore::reset_stats() {
  const ExpertStoreStats keep = stats_;
  stats_ = ExpertStoreStats{};
  stats_.resident_bytes = keep.resident_bytes;
  stats_.cache_bytes = keep.cache_bytes;
  stats_.cache_slots = keep.cache_slots;
  stats_.io_engine = keep.io_engine;
  for (auto& c : chosen_) std::fill(c.begin(), c.end(), 0);
}

}  // namespace pyinfer
