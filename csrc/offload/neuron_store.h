// Neurons that do not fit in the RAM budget, read from a bundle file while the model computes
// (PowerInfer-2 / LLM in a flash on a PC).
//
// The bundle file holds, per layer, every neuron's gate row, up row and down row side by side in the
// plan's hot-first order, so one read fetches all three. A layer's first `resident` bundles (the hottest)
// are read once into RAM; the rest of the layer (its cold tail) is streamed through a small ring of slots
// by a dedicated I/O thread that reads ahead in layer order, so the read of the next layers overlaps the
// compute of this one. Weights the graph reads through the store are "paged": their `data` is a table of
// row pointers the store keeps pointing at wherever each row is now.
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

#include "offload/neuron_cache.h"

namespace pyinfer {

// Parts of a bundle, in file order; DenseDown is not in the bundles but the layer's original down matrix
// [d, n_ff], stored after them for dense runs (prefill), read whole in large sequential reads.
enum class BundlePart : int { Gate = 0, Up = 1, Down = 2, DenseDown = 3 };
constexpr int kBundleParts = 3;
constexpr int kTables = 4;

struct BundleLayer {
  int64_t n_ff = 0;
  int64_t resident = 0;          // bundles [0, resident) stay in RAM
  uint64_t file_offset = 0;      // of bundle 0; the layer's region is padded to kIoAlign in the file
  uint64_t bundle_bytes = 0;     // gate | up | down
  std::array<uint64_t, kBundleParts> part_offset{};  // of each part inside a bundle
  // Which table row bundle k feeds for each part: empty means k (a down kept in the original neuron order
  // passes the plan's permutation).
  std::array<std::vector<int32_t>, kBundleParts> row_of{};
  // Decode reads only the listed neurons of the tail (a predictor picks them), on demand, with many reads in
  // flight; not read ahead. Other layers' tails are streamed whole by the read-ahead ring.
  bool selective = false;
  // Selective layers: the first `window` cold bundles (the likeliest to fire after the resident ones) are read
  // ahead by the reader thread like a streamed tail, hidden behind the compute of earlier layers; listed
  // neurons inside the window need no read of their own.
  int64_t window = 0;
  // The original down [dense_rows, n_ff] for dense runs (0 rows: none), dense_row_bytes per row, kIoAlign-aligned.
  uint64_t dense_offset = 0;
  int64_t dense_rows = 0;
  uint64_t dense_row_bytes = 0;
};

struct NeuronStoreStats {
  uint64_t bytes_read = 0;       // by the I/O thread, cold tails only
  uint64_t reads = 0;            // layer tails read
  double read_seconds = 0;       // inside pread
  double wait_seconds = 0;       // fetch() blocked on a tail that was not read yet (I/O not hidden)
  uint64_t fetches = 0;          // fetch() calls for layers with a cold tail
  uint64_t listed_reads = 0;     // selective layers: ranges read for listed neurons
  uint64_t listed_neurons = 0;   // selective layers: cold neurons fetched by list
  uint64_t listed_hits = 0;      // selective layers: listed neurons already resident (RAM hits)
  uint64_t cache_hits = 0;       // selective layers: listed cold neurons found in the neuron cache
  uint64_t window_hits = 0;      // selective layers: listed cold neurons found in the read-ahead window
  uint64_t cache_evictions = 0;  // cached neurons dropped for newer ones
  uint64_t cache_bytes = 0;
  uint64_t dense_bytes_read = 0;  // dense runs' original down matrices (prefill)
  double dense_seconds = 0;
  uint64_t resident_bytes = 0;
  uint64_t ring_bytes = 0;
  bool direct_io = false;        // O_DIRECT accepted by the file system
  const char* io_engine = "none";  // selective reads: "io_uring", or "pread" threads where it is refused
};

// How listed reads are clustered: page ranges closer than merge_gap bytes are read as one (the gap is read
// rather than paid for with another request), and a range is cut at max_range bytes so several stay in flight.
struct ReadClusters {
  uint64_t merge_gap = 8192;
  uint64_t max_range = 256 * 1024;
};

class NeuronStore {
 public:
  static constexpr uint64_t kIoAlign = 4096;
  // Opens `path` and reads every layer's resident bundles. ring_slots >= 1 tails are buffered (2 lets one
  // layer compute while the next is read). Throws std::runtime_error naming the file on any I/O error.
  // io_threads: reads in flight for selective layers. cache_bytes: the neuron cache of selective layers, cold
  // neurons read earlier kept for the next tokens (consecutive tokens share many), least recently used out.
  NeuronStore(const std::string& path, std::vector<BundleLayer> layers, int ring_slots, bool direct_io,
              int io_threads = 4, uint64_t cache_bytes = 0, bool use_uring = true, ReadClusters clusters = {});
  ~NeuronStore();
  NeuronStore(const NeuronStore&) = delete;
  NeuronStore& operator=(const NeuronStore&) = delete;

  // Row pointer table of one part of one layer: [n_ff] pointers, valid for the rows fetch() made ready.
  const uint8_t* const* table(int layer, BundlePart part) const;
  int n_layers() const { return int(layers_.size()); }
  const BundleLayer& layer(int l) const { return layers_.at(size_t(l)); }
  // Makes every row of `layer` readable through its tables until the next fetch() of another layer with a
  // cold tail (the previous layer's slot is handed back to the reader here). Blocks until the tail is read;
  // rethrows an I/O error of the reader thread. `list` (count, then ascending ids; a count of -1 means all):
  // for a selective layer, only those rows need to be readable.
  void fetch(int layer, const int32_t* list = nullptr);
  // The compute is done with `layer`'s rows: its slot goes back to the reader now rather than at the next
  // fetch (so the read-ahead also runs while attention and the output head compute).
  void release(int layer);
  // A dense run (prefill): reads the layer's original down matrix whole, in large reads, into one buffer that
  // the DenseDown table points into until the next fetch_dense.
  void fetch_dense(int layer);
  NeuronStoreStats stats() const;
  void reset_stats();

 private:
  enum class SlotState { Empty, Reading, Ready, InUse };
  struct Slot {
    uint8_t* mem = nullptr;
    int layer = -1;
    SlotState state = SlotState::Empty;
  };
  uint64_t tail_begin(const BundleLayer& b) const;  // aligned file range of the cold tail
  uint64_t tail_end(const BundleLayer& b) const;
  uint64_t ahead_end(const BundleLayer& b) const;   // end of what the reader thread reads ahead: the tail, or
                                                    // a selective layer's window
  // Waits for `layer`'s read-ahead slot and marks it in use (the previous layer's slot goes back first).
  Slot* ready_slot(int layer);
  void read_exact(uint8_t* dst, uint64_t offset, uint64_t bytes) const;
  // Table entries of bundles [k0, k1) (or bundle k) of `layer`, whose bytes lie at `base`, which holds the
  // file from `base_offset` on.
  void point_row(int layer, int64_t k, const uint8_t* base, uint64_t base_offset);
  void point_rows(int layer, int64_t k0, int64_t k1, const uint8_t* base, uint64_t base_offset);
  void reader();
  void fetch_selective(int layer, const int32_t* list, const uint8_t* window);
  std::unique_ptr<class RangeReader> pread_reader();
  void read_ranges();  // ranges_, through io_ (a failed io_uring ring is swapped for pread threads)

  std::vector<BundleLayer> layers_;
  std::vector<std::array<std::vector<const uint8_t*>, kTables>> tables_;
  std::vector<int> cold_order_;      // layers with a cold tail, in compute order
  std::vector<int> cold_pos_;        // layer -> index in cold_order_ (-1: fully resident)
  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
  uint8_t* resident_ = nullptr;
  uint8_t* ring_ = nullptr;
  std::vector<Slot> slots_;
  uint8_t* demand_ = nullptr;        // selective layers' rows of the current fetch
  uint8_t* dense_ = nullptr;         // the original down of the current dense run
  std::unique_ptr<class RangeReader> io_;       // selective reads: io_uring or pread threads
  std::vector<std::unique_ptr<class RangeReader>> retired_;  // a failed ring, kept until its reads are surely done
  int io_threads_ = 4;
  uint64_t merge_gap_, max_range_;
  std::vector<struct ReadRange> ranges_;      // scratch of fetch_selective
  std::vector<std::pair<int64_t, size_t>> placed_;
  NeuronCache cache_;                // selective layers' cold neurons read for earlier tokens

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  size_t next_read_ = 0;             // index into cold_order_ of the next tail to read
  bool stop_ = false;
  std::exception_ptr error_;
  NeuronStoreStats stats_;
  std::thread reader_;
};

}  // namespace pyinfer
