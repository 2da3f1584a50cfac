// Experts of a Mixture-of-Experts model that do not fit in RAM, read from the model file when the router
// chooses them (PowerInfer-2's and SmallThinker's expert streaming; llama.cpp leaves this to the mmap page
// cache). Per layer, a set of hot experts chosen from a routing profile stays resident; every other expert
// passes through a cache of slots shared by all layers (least recently used out, or least frequently used).
// A fetch, run right after a layer's router, makes the experts its tokens chose readable: hits cost nothing,
// misses are read with many requests in flight (io_uring, or pread threads). Weights the graph reads through
// the store are "paged": their `data` is a table of n_expert pointers, each the start of an expert's rows.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pyinfer {

constexpr int kExpertParts = 3;  // gate, up, down

struct ExpertLayer {
  int32_t n_expert = 0;
  // Where part p's merged tensor ([n_expert * rows, cols], experts one after another) lies in the file, and
  // the bytes of one expert of it.
  std::array<uint64_t, kExpertParts> file_offset{};
  std::array<uint64_t, kExpertParts> expert_bytes{};
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
};

class ExpertStore {
 public:
  // Opens `path`, reads every layer's resident experts and makes `cache_slots` slots for the rest (at least as
  // many as one layer can choose in one run, or fetch() throws). Throws std::runtime_error naming the file on
  // any I/O error.
  ExpertStore(const std::string& path, std::vector<ExpertLayer> layers, int64_t cache_slots,
              ExpertPolicy policy = ExpertPolicy::Lru, int io_threads = 8, bool use_uring = true);
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
  ExpertStoreStats stats() const { return stats_; }
  void reset_stats();
  // Per layer and expert, how many fetches chose it since the last reset (a routing profile).
  const std::vector<std::vector<uint64_t>>& chosen() const { return chosen_; }

 private:
  struct Slot {
    uint8_t* mem = nullptr;
    int layer = -1, expert = -1;
    uint64_t used = 0;  // the fetch that last needed it
  };
  void point(int layer, int expert, const uint8_t* base);
  void read_exact(uint8_t* dst, uint64_t offset, uint64_t bytes) const;
  void read_ranges();

  std::vector<ExpertLayer> layers_;
  std::vector<std::array<std::vector<const uint8_t*>, kExpertParts>> tables_;
  std::vector<std::vector<int32_t>> slot_of_;  // [layer][expert]: cache slot, -1 (not cached) or -2 (resident)
  std::vector<std::vector<uint64_t>> chosen_;
  std::vector<std::vector<uint64_t>> uses_;    // [layer][expert]: fetches that chose it, ever (the LFU policy)
  std::string path_;
  int fd_ = -1;
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
};

}  // namespace pyinfer
