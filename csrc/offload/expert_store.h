// Experts of a Mixture-of-Experts model that do not fit in RAM, read from the model file when the router
// chooses them (PowerInfer-2's and SmallThinker's expert streaming; llama.cpp leaves this to the mmap page
// cache). Per layer, a set of hot experts chosen from a routing profile stays resident; every other expert
// passes through a cache of slots shared by all layers (least recently used out, or least frequently used).
// A fetch, run right after a layer's router, makes the experts its tokens chose readable: hits cost nothing,
// misses are read with many requests in flight (io_uring, or pread threads). Weights the graph reads through
// the store are "paged": their `data` is a table of n_expert pointers, each the start of an expert's rows.
// Reads bypass the page cache (O_DIRECT) where the file system allows: each part of a slot starts on a page
// with a page to spare, so the page-aligned range around an expert's bytes lands there whole (no copy out of
// the page cache, no cache pages for a memory limit to reclaim). A layer whose experts all start on pages (an
// expert bundle file) needs no spare page, and an expert whose parts lie side by side in the file as in the
// slot is one read.
// A prefetch, run with the experts the next layer's router picks from this layer's hidden state (pre-gated MoE,
// ProMoE), starts reading them on a thread of its own while this layer computes; the next fetch waits for it.
#pragma once
#include <array>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace pyinfer {

constexpr int kExpertParts = 3;  // gate, up, down

struct ExpertLayer {
  int32_t n_expert = 0;
  // Where expert 0 of part p lies in the file, the bytes of one expert of it, and the bytes from one expert
  // of part p to the next (0: expert_bytes, a merged tensor [n_expert * rows, cols] of a GGUF; an expert
  // bundle file keeps each expert's three parts together, so its stride is the whole bundle's).
  std::array<uint64_t, kExpertParts> file_offset{};
  std::array<uint64_t, kExpertParts> expert_bytes{};
  std::array<uint64_t, kExpertParts> expert_stride{};
  std::vector<int32_t> resident;  // experts kept in RAM (read once, never evicted)
};

enum class ExpertPolicy : int { Lru = 0, Lfu = 1 };

struct ExpertStoreStats {
  uint64_t fetches = 0;          // fetch() calls
  uint64_t requests = 0;         // experts the runs chose (distinct per fetch)
  uint64_t resident_hits = 0;    // of them, resident experts
  uint64_t cache_hits = 0;       // of them, found in the cache
  uint64_t misses = 0;           // of them, read from the file
  uint64_t evictions = 0;
  uint64_t bytes_read = 0;       // by misses
  double read_seconds = 0;       // fetch() blocked on reads
  uint64_t resident_bytes = 0;
  uint64_t cache_bytes = 0;
  int64_t cache_slots = 0;
  const char* io_engine = "none";
  bool direct_io = false;        // reads bypass the page cache
  // Read-ahead (prefetch): how good the next-layer prediction was and what it read.
  uint64_t predicted = 0;          // experts chosen in fetches whose layer had a prediction
  uint64_t predicted_right = 0;    // of them, in the prediction
  uint64_t prefetched = 0;         // experts read ahead (their bytes are in bytes_read and prefetch_bytes)
  uint64_t prefetch_used = 0;      // of them, chosen by the next fetch of their layer
  uint64_t prefetch_bytes = 0;
  uint64_t prefetch_failures = 0;  // read-ahead jobs whose reads failed (their experts are read again on demand)
  double prefetch_wait_seconds = 0;  // fetch() waited for read-ahead still in flight
};

class ExpertStore {
 public:
  // Opens `path`, reads every layer's resident experts and makes `cache_slots` slots for the rest (at least as
  // many as one layer can choose in one run, or fetch() throws). Throws std::runtime_error naming the file on
  // any I/O error.
  // `direct_io`: read with O_DIRECT where the file system allows (else through the page cache).
  ExpertStore(const std::string& path, std::vector<ExpertLayer> layers, int64_t cache_slots,
              ExpertPolicy policy = ExpertPolicy::Lru, int io_threads = 8, bool use_uring = true,
              bool direct_io = true);
  ~ExpertStore();
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  int n_layers() const { return int(layers_.size()); }
  const ExpertLayer& layer(int l) const { return layers_.at(size_t(l)); }
  // [n_expert] pointers to the experts' bytes of one part of one layer (nullptr: not in RAM now).
  const uint8_t* const* table(int layer, int part) const { return tables_.at(size_t(layer))[size_t(part)].data(); }
  // Makes every expert that route rows [0, n_tok) name readable (route: F32 [n_tok, 2k], ids after the k weights,
  // rows `stride` floats apart), until the next fetch of another run needs their slots.
  void fetch(int layer, const float* route, int64_t n_tok, int32_t k, int64_t stride);
  // Starts reading the experts a predicted route names for `layer` (same layout as fetch) into free or evictable
  // slots, never those the last fetch's run is computing with, and returns at once; the next fetch (or
  // prefetch) waits for those reads. A failed read-ahead is forgotten: fetch reads the experts again.
  void prefetch(int layer, const float* route, int64_t n_tok, int32_t k, int64_t stride);
  ExpertStoreStats stats() const { return stats_; }
  void reset_stats();
  // Per layer and expert, how many fetches chose it since the last reset (a routing profile).
  const std::vector<std::vector<uint64_t>>& chosen() const { return chosen_; }

 private:
  struct Slot {
    uint8_t* mem = nullptr;
    int layer = -1, expert = -1;
    uint64_t used = 0;  // the fetch that last needed it
    bool ahead = false;  // read ahead by prefetch() and not chosen since
  };
  void point(int layer, int expert, const uint8_t* base);
  void read_exact(int fd, uint8_t* dst, uint64_t offset, uint64_t bytes) const;
  // The reads that bring expert `expert` of `layer` into the slot at `base` (one per part, or one for parts
  // that lie side by side in the file as in the slot): page-aligned for O_DIRECT where the file allows, else
  // the exact bytes (read through the page cache).
  void add_ranges(int layer, int expert, uint8_t* base, std::vector<struct ReadRange>& out) const;
  std::unique_ptr<class RangeReader> make_reader();
  // Reads `ranges` with `io`, falling back to pread threads (old ring kept in `retired`) if the ring broke.
  void read_with(std::unique_ptr<class RangeReader>& io, std::vector<std::unique_ptr<class RangeReader>>& retired,
                 const std::vector<struct ReadRange>& ranges);
  void read_ranges();
  // The slot a new expert goes to: a free one, else the policy's victim among slots not used by fetch `now`.
  int64_t pick_victim(uint64_t now) const;
  void take_slot(int64_t slot, int layer, int expert, uint64_t now);
  void forget(const std::vector<struct ReadRange>& ranges);  // slots whose reads failed hold nothing
  void wait_prefetch();
  void prefetch_loop();

  std::vector<ExpertLayer> layers_;
  std::vector<std::array<uint64_t, kExpertParts>> part_at_;  // [layer][part]: where the part starts in a slot
  std::vector<std::array<std::vector<const uint8_t*>, kExpertParts>> tables_;
  std::vector<std::vector<int32_t>> slot_of_;  // [layer][expert]: cache slot, -1 (not cached) or -2 (resident)
  std::vector<std::vector<uint64_t>> chosen_;
  std::vector<std::vector<uint64_t>> uses_;    // [layer][expert]: fetches that chose it, ever (the LFU policy)
  std::string path_;
  int fd_ = -1;
  int direct_fd_ = -1;     // the same file opened O_DIRECT (-1: not allowed here)
  uint64_t file_size_ = 0;
  ExpertPolicy policy_;
  int io_threads_;
  uint64_t slot_bytes_ = 0;
  uint8_t* resident_ = nullptr;
  uint64_t resident_map_ = 0;
  uint8_t* cache_ = nullptr;
  uint64_t cache_map_ = 0;
  std::vector<Slot> slots_;
  std::vector<uint8_t> seen_;                  // scratch of fetch: experts already counted in this run
  std::vector<struct ReadRange> ranges_;
  std::unique_ptr<class RangeReader> io_;
  std::vector<std::unique_ptr<class RangeReader>> retired_;
  uint64_t clock_ = 0;
  ExpertStoreStats stats_;
  bool use_uring_ = true;

  // Read-ahead: one job at a time, read by pf_thread_ with a reader of its own. The job's ranges and result are
  // guarded by pf_mutex_; the slots and tables they touch were assigned by prefetch() before queueing, and no
  // reader looks at them before wait_prefetch() has seen the job done.
  std::vector<std::vector<uint8_t>> predicted_;  // [layer][expert]: named by the layer's pending prediction
  std::vector<uint8_t> has_prediction_;          // [layer]
  std::vector<int32_t> want_;                    // scratch of prefetch()
  std::mutex pf_mutex_;
  std::condition_variable pf_cv_;
  std::vector<struct ReadRange> pf_ranges_;
  bool pf_queued_ = false, pf_done_ = false, pf_stop_ = false;
  std::exception_ptr pf_error_;
  std::unique_ptr<class RangeReader> pf_io_;
  std::vector<std::unique_ptr<class RangeReader>> pf_retired_;
  std::thread pf_thread_;
};

}  // namespace pyinfer
