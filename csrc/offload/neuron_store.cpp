#include "offload/neuron_store.h"

#include "offload/parallel_reader.h"
#include "offload/uring_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace pyinfer {

namespace {


uint64_t round_down(uint64_t x, uint64_t a) { return x / a * a; }
uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint8_t* aligned_bytes(uint64_t n) {
  void* p = nullptr;
  if (n == 0) return nullptr;
  if (posix_memalign(&p, NeuronStore::kIoAlign, size_t(n)) != 0) throw std::bad_alloc();
  return static_cast<uint8_t*>(p);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

NeuronStore::NeuronStore(const std::string& path, std::vector<BundleLayer> layers, int ring_slots, bool direct_io,
                         int io_threads, uint64_t cache_bytes, bool use_uring, ReadClusters clusters)
    : layers_(std::move(layers)), path_(path), merge_gap_(clusters.merge_gap), max_range_(clusters.max_range) {
  if (max_range_ < kIoAlign || max_range_ % kIoAlign || max_range_ > (uint64_t(64) << 20) || merge_gap_ > (1u << 20))
    throw std::invalid_argument("read clusters: max_range must be whole pages up to 64 MiB, merge_gap at most 1 MiB");
  if (ring_slots < 1 || ring_slots > 64) throw std::invalid_argument("ring_slots must be 1..64");
  if (io_threads < 1 || io_threads > 64) throw std::invalid_argument("io_threads must be 1..64");
  uint64_t resident_bytes = 0, slot_bytes = 0, demand_bytes = 0, dense_bytes = 0, cache_slot_bytes = 0;
  cold_pos_.assign(layers_.size(), -1);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const BundleLayer& b = layers_[l];
    if (b.n_ff < 1 || b.resident < 0 || b.resident > b.n_ff || b.bundle_bytes == 0 || b.file_offset % kIoAlign)
      throw std::invalid_argument("bundle layer " + std::to_string(l) + " has an invalid layout");
    for (int p = 0; p < kBundleParts; ++p) {
      if (b.part_offset[size_t(p)] >= b.bundle_bytes)
        throw std::invalid_argument("bundle layer " + std::to_string(l) + ": a part lies outside the bundle");
      const auto& rows = b.row_of[size_t(p)];
      if (!rows.empty() && int64_t(rows.size()) != b.n_ff)
        throw std::invalid_argument("bundle layer " + std::to_string(l) + ": row map of the wrong length");
      std::vector<uint8_t> seen(size_t(b.n_ff), 0);
      for (int32_t r : rows) {
        if (r < 0 || r >= b.n_ff || seen[size_t(r)]) throw std::invalid_argument("bundle row map is not a permutation");
        seen[size_t(r)] = 1;
      }
    }
    if (b.dense_rows < 0 || (b.dense_rows > 0 && (b.dense_offset % kIoAlign || b.dense_row_bytes == 0)))
      throw std::invalid_argument("bundle layer " + std::to_string(l) + ": a bad dense down region");
    dense_bytes = std::max(dense_bytes, round_up(uint64_t(b.dense_rows) * b.dense_row_bytes, kIoAlign));
    resident_bytes += round_up(uint64_t(b.resident) * b.bundle_bytes, kIoAlign);
    if (b.window < 0 || (b.window > 0 && !b.selective))
      throw std::invalid_argument("bundle layer " + std::to_string(l) +
                                  ": a read-ahead window is for selective layers");
    if (b.resident < b.n_ff && b.selective) {
      demand_bytes = std::max(demand_bytes, tail_end(b) - tail_begin(b));
      cache_slot_bytes = std::max(cache_slot_bytes, b.bundle_bytes);
    }
    if (b.resident < b.n_ff && (!b.selective || b.window > 0)) {
      cold_pos_[l] = int(cold_order_.size());
      cold_order_.push_back(int(l));
      slot_bytes = std::max(slot_bytes, ahead_end(b) - tail_begin(b));
    }
  }
  std::vector<int64_t> cached_neurons;
  for (const BundleLayer& b : layers_) cached_neurons.push_back(b.selective ? b.n_ff : 0);
  cache_ = NeuronCache(cached_neurons, cache_slot_bytes, cache_bytes);
  tables_.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (int p = 0; p < kBundleParts; ++p) tables_[l][size_t(p)].assign(size_t(layers_[l].n_ff), nullptr);
    tables_[l][size_t(BundlePart::DenseDown)].assign(size_t(layers_[l].dense_rows), nullptr);
  }

  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct_io ? O_DIRECT : 0));
  direct_ = direct_io && fd_ >= 0;
  if (fd_ < 0 && direct_io) fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // O_DIRECT refused at open
  if (fd_ < 0) throw std::runtime_error("cannot open bundle file " + path + ": " + std::strerror(errno));
  if (direct_) {  // some file systems accept O_DIRECT at open and refuse it at read (EINVAL): ask once, now
    uint8_t* probe = aligned_bytes(kIoAlign);
    const ssize_t got = ::pread(fd_, probe, kIoAlign, 0);
    const int err = errno;
    std::free(probe);
    if (got < 0 && err == EINVAL) {
      ::close(fd_);
      direct_ = false;
      fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ < 0) throw std::runtime_error("cannot open bundle file " + path + ": " + std::strerror(errno));
    }
  }
  try {
    resident_ = aligned_bytes(resident_bytes);
    uint64_t off = 0;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const BundleLayer& b = layers_[l];
      const uint64_t bytes = round_up(uint64_t(b.resident) * b.bundle_bytes, kIoAlign);
      if (bytes) read_exact(resident_ + off, b.file_offset, bytes);
      point_rows(int(l), 0, b.resident, resident_ + off, b.file_offset);
      off += bytes;
    }
    const int n_slots = cold_order_.empty() ? 0 : std::min<int>(ring_slots, int(cold_order_.size()));
    ring_ = aligned_bytes(uint64_t(n_slots) * slot_bytes);
    for (int s = 0; s < n_slots; ++s) slots_.push_back(Slot{ring_ + uint64_t(s) * slot_bytes, -1, SlotState::Empty});
    demand_ = aligned_bytes(demand_bytes);
    stats_.cache_bytes = cache_.bytes();
    dense_ = aligned_bytes(dense_bytes);
    if (demand_bytes || dense_bytes) {
      io_threads_ = io_threads;
      if (use_uring) {
        try {  // one thread, io_threads reads in flight
          io_ = std::make_unique<UringReader>(fd_, unsigned(io_threads), path_);
        } catch (const std::runtime_error&) {
          io_.reset();  // refused by this kernel: pread threads
        }
      }
      if (!io_) io_ = pread_reader();
    }
    stats_.resident_bytes = resident_bytes;
    stats_.ring_bytes = uint64_t(n_slots) * slot_bytes + demand_bytes + dense_bytes;
    stats_.direct_io = direct_;
    stats_.io_engine = io_ ? io_->kind() : "none";
  } catch (...) {
    io_.reset();
    ::close(fd_);
    std::free(resident_);
    std::free(ring_);
    std::free(demand_);
    std::free(dense_);
    throw;
  }
  if (!slots_.empty()) reader_ = std::thread(&NeuronStore::reader, this);
}

NeuronStore::~NeuronStore() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (reader_.joinable()) reader_.join();
  io_.reset();
  retired_.clear();
  ::close(fd_);
  std::free(resident_);
  std::free(ring_);
  std::free(demand_);
  std::free(dense_);
}

uint64_t NeuronStore::tail_begin(const BundleLayer& b) const {
  return round_down(b.file_offset + uint64_t(b.resident) * b.bundle_bytes, kIoAlign);
}

uint64_t NeuronStore::ahead_end(const BundleLayer& b) const {
  if (!b.selective) return tail_end(b);
  const int64_t last = std::min(b.n_ff, b.resident + b.window);
  return round_up(b.file_offset + uint64_t(last) * b.bundle_bytes, kIoAlign);
}

uint64_t NeuronStore::tail_end(const BundleLayer& b) const {
  return round_up(b.file_offset + uint64_t(b.n_ff) * b.bundle_bytes, kIoAlign);
}

void NeuronStore::read_exact(uint8_t* dst, uint64_t offset, uint64_t bytes) const {
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(fd_, dst + done, size_t(bytes - done), off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw std::runtime_error("reading bundle file " + path_ + ": " + std::strerror(errno));
    if (got == 0) throw std::runtime_error("bundle file " + path_ + " is shorter than its layout (truncated?)");
    done += uint64_t(got);
  }
}

void NeuronStore::read_ranges() {
  try {
    io_->read_all(ranges_);
  } catch (...) {
    auto* ring = dynamic_cast<UringReader*>(io_.get());
    if (!ring || !ring->broken()) throw;
    // The ring failed with reads in flight (into buffers that live on): never use it again.
    retired_.push_back(std::move(io_));
    io_ = pread_reader();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.io_engine = io_->kind();
    }
    io_->read_all(ranges_);
  }
}

std::unique_ptr<RangeReader> NeuronStore::pread_reader() {
  return std::make_unique<ParallelReader>(
      [this](uint8_t* dst, uint64_t off, uint64_t n) { read_exact(dst, off, n); }, io_threads_);
}

void NeuronStore::point_row(int layer, int64_t k, const uint8_t* base, uint64_t base_offset) {
  const BundleLayer& b = layers_[size_t(layer)];
  for (int p = 0; p < kBundleParts; ++p) {  // base holds the file from base_offset on
    const auto& rows = b.row_of[size_t(p)];
    tables_[size_t(layer)][size_t(p)][size_t(rows.empty() ? k : rows[size_t(k)])] =
        base + (b.file_offset + uint64_t(k) * b.bundle_bytes + b.part_offset[size_t(p)] - base_offset);
  }
}

void NeuronStore::point_rows(int layer, int64_t k0, int64_t k1, const uint8_t* base, uint64_t base_offset) {
  for (int64_t k = k0; k < k1; ++k) point_row(layer, k, base, base_offset);
}

const uint8_t* const* NeuronStore::table(int layer, BundlePart part) const {
  return tables_.at(size_t(layer))[size_t(part)].data();
}

void NeuronStore::fetch_selective(int layer, const int32_t* list, const uint8_t* window) {
  const BundleLayer& b = layers_[size_t(layer)];
  const auto t0 = std::chrono::steady_clock::now();
  ranges_.clear();
  placed_.clear();
  cache_.begin_fetch();
  const bool caching = cache_.caches(layer);
  uint64_t out = 0, listed = 0, hits = 0, cache_hits = 0, evictions = 0, window_hits = 0;
  const int64_t window_end = window ? std::min(b.n_ff, b.resident + b.window) : b.resident;
  const bool dense = !list || list[0] < 0;
  if (dense) {  // a dense run: the whole tail, in large reads
    const uint64_t begin = tail_begin(b), end = tail_end(b);
    for (uint64_t off = begin; off < end; off += max_range_)
      ranges_.push_back(ReadRange{demand_ + (off - begin), off, std::min(max_range_, end - off)});
  } else {
    uint64_t cur0 = 0, cur1 = 0;  // the open range [cur0, cur1) of the file
    bool open = false;
    auto flush = [&] {
      ranges_.push_back(ReadRange{demand_ + out, cur0, cur1 - cur0});
      out += cur1 - cur0;
    };
    int64_t prev = -1;
    for (int32_t i = 0; i < list[0]; ++i) {
      const int64_t k = list[1 + i];
      // Ascending ids keep the page ranges disjoint and within the tail, so they fit the demand buffer.
      if (k <= prev || k >= b.n_ff) throw std::out_of_range("fetch: listed neurons must be ascending ids < n_ff");
      prev = k;
      if (k < b.resident) {
        ++hits;
        continue;
      }
      const uint64_t b0 = b.file_offset + uint64_t(k) * b.bundle_bytes;
      if (k < window_end) {  // read ahead with the window (its slot holds the file from tail_begin on)
        point_row(layer, k, window, tail_begin(b));
        ++window_hits;
        continue;
      }
      if (const uint8_t* cached = caching ? cache_.find(layer, k) : nullptr) {  // read for an earlier token
        point_row(layer, k, cached, b0);
        ++cache_hits;
        continue;
      }
      const uint64_t p0 = round_down(b0, kIoAlign), p1 = round_up(b0 + b.bundle_bytes, kIoAlign);
      size_t holder = ranges_.size();  // the range whose bytes hold b0 (the open one, flushed or not)
      if (open && p0 <= cur1 + merge_gap_ && p1 - cur0 <= max_range_) {
        cur1 = std::max(cur1, p1);
      } else {
        // A range cut at max_range_ may end inside this bundle's first page: the next range starts where it
        // ended, so no page is read twice (the ranges stay disjoint and fit the demand buffer) and the bundle's
        // bytes run on contiguously from the previous range's buffer into the next one's.
        const bool continues = open && b0 < cur1;
        if (open) flush();
        if (!continues) holder = ranges_.size();
        cur0 = continues ? cur1 : p0;
        cur1 = p1;
        open = true;
      }
      placed_.emplace_back(k, holder);
      ++listed;
    }
    if (open) flush();
  }
  read_ranges();
  if (dense)
    point_rows(layer, b.resident, b.n_ff, demand_, tail_begin(b));
  else
    for (const auto& [k, r] : placed_) {
      point_row(layer, k, ranges_[r].dst, ranges_[r].offset);
      bool evicted = false;
      const uint8_t* bundle = ranges_[r].dst + (b.file_offset + uint64_t(k) * b.bundle_bytes - ranges_[r].offset);
      if (caching && cache_.insert(layer, k, bundle, b.bundle_bytes, evicted)) evictions += evicted;
    }
  uint64_t bytes = 0;
  for (const ReadRange& r : ranges_) bytes += r.bytes;
  const double dt = seconds_since(t0);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.fetches;
  stats_.bytes_read += bytes;
  stats_.reads += ranges_.size();
  stats_.read_seconds += dt;
  stats_.wait_seconds += dt;  // on demand: nothing hides it
  if (!dense) {
    stats_.listed_reads += ranges_.size();
    stats_.listed_neurons += listed;
    stats_.listed_hits += hits;
    stats_.cache_hits += cache_hits;
    stats_.window_hits += window_hits;
    stats_.cache_evictions += evictions;
  }
}

void NeuronStore::fetch(int layer, const int32_t* list) {
  if (layer < 0 || size_t(layer) >= layers_.size()) throw std::out_of_range("fetch: no such layer");
  const BundleLayer& b = layers_[size_t(layer)];
  if (b.selective && b.resident < b.n_ff) {
    const uint8_t* window = nullptr;
    if (cold_pos_[size_t(layer)] >= 0) {
      const auto t0 = std::chrono::steady_clock::now();
      window = ready_slot(layer)->mem;
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.wait_seconds += seconds_since(t0);
    }
    return fetch_selective(layer, list, window);
  }
  if (cold_pos_[size_t(layer)] < 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  Slot* slot = ready_slot(layer);
  point_rows(layer, b.resident, b.n_ff, slot->mem, tail_begin(b));
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.fetches;
  stats_.wait_seconds += seconds_since(t0);
}

NeuronStore::Slot* NeuronStore::ready_slot(int layer) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (Slot& s : slots_)
    if (s.state == SlotState::InUse) s.state = SlotState::Empty;  // the previous layer's compute is done
  auto find = [&]() -> Slot* {
    for (Slot& s : slots_)
      if (s.layer == layer && s.state != SlotState::Empty) return &s;
    return nullptr;
  };
  if (!find()) {
    // Out of the expected order (a failed run, or the first fetch): restart the read-ahead at this layer.
    cv_.wait(lock, [&] {
      for (const Slot& s : slots_)
        if (s.state == SlotState::Reading) return false;
      return true;
    });
    for (Slot& s : slots_) s = Slot{s.mem, -1, SlotState::Empty};
    next_read_ = size_t(cold_pos_[size_t(layer)]);
    error_ = nullptr;
  }
  cv_.notify_all();
  Slot* slot = nullptr;
  cv_.wait(lock, [&] {
    slot = find();
    return error_ || (slot && slot->state == SlotState::Ready);
  });
  if (error_ && !(slot && slot->state == SlotState::Ready)) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    for (Slot& s : slots_) s = Slot{s.mem, -1, SlotState::Empty};
    std::rethrow_exception(e);
  }
  slot->state = SlotState::InUse;
  return slot;
}

void NeuronStore::reader() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    Slot* slot = nullptr;
    cv_.wait(lock, [&] {
      if (stop_) return true;
      if (error_) return false;  // until fetch() has reported it
      for (Slot& s : slots_)
        if (s.state == SlotState::Empty) {
          slot = &s;
          return true;
        }
      return false;
    });
    if (stop_) return;
    const int layer = cold_order_[next_read_];
    next_read_ = (next_read_ + 1) % cold_order_.size();
    slot->layer = layer;
    slot->state = SlotState::Reading;
    const BundleLayer& b = layers_[size_t(layer)];
    const uint64_t begin = tail_begin(b), bytes = ahead_end(b) - begin;
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    std::exception_ptr failed;
    try {
      read_exact(slot->mem, begin, bytes);
    } catch (...) {
      failed = std::current_exception();
    }
    const double dt = seconds_since(t0);
    lock.lock();
    stats_.read_seconds += dt;
    if (failed) {
      error_ = failed;
      slot->state = SlotState::Empty;
      slot->layer = -1;
    } else {
      stats_.bytes_read += bytes;
      ++stats_.reads;
      slot->state = SlotState::Ready;
    }
    cv_.notify_all();
  }
}

void NeuronStore::release(int layer) {
  if (layer < 0 || size_t(layer) >= layers_.size()) throw std::out_of_range("release: no such layer");
  if (cold_pos_[size_t(layer)] < 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Slot& s : slots_)
      if (s.state == SlotState::InUse && s.layer == layer) s.state = SlotState::Empty;
  }
  cv_.notify_all();
}

void NeuronStore::fetch_dense(int layer) {
  if (layer < 0 || size_t(layer) >= layers_.size()) throw std::out_of_range("fetch: no such layer");
  const BundleLayer& b = layers_[size_t(layer)];
  if (b.dense_rows == 0) throw std::runtime_error("bundle file " + path_ + " holds no dense down for this layer");
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t bytes = round_up(uint64_t(b.dense_rows) * b.dense_row_bytes, kIoAlign);
  constexpr uint64_t kChunk = 1 << 20;  // large sequential reads, a few in flight
  ranges_.clear();
  for (uint64_t off = 0; off < bytes; off += kChunk)
    ranges_.push_back(ReadRange{dense_ + off, b.dense_offset + off, std::min(kChunk, bytes - off)});
  read_ranges();
  auto& table = tables_[size_t(layer)][size_t(BundlePart::DenseDown)];
  for (int64_t r = 0; r < b.dense_rows; ++r) table[size_t(r)] = dense_ + uint64_t(r) * b.dense_row_bytes;
  const double dt = seconds_since(t0);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.dense_bytes_read += bytes;
  stats_.dense_seconds += dt;
  stats_.wait_seconds += dt;
}

NeuronStoreStats NeuronStore::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void NeuronStore::reset_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  const NeuronStoreStats keep = stats_;
  stats_ = NeuronStoreStats{};
  stats_.resident_bytes = keep.resident_bytes;
  stats_.ring_bytes = keep.ring_bytes;
  stats_.direct_io = keep.direct_io;
  stats_.io_engine = keep.io_engine;
  stats_.cache_bytes = keep.cache_bytes;
}

}  // namespace pyinfer
