// An LRU cache of cold neurons' bundles, shared by the predictor layers of a neuron store: a bundle read for
// one token stays for the tokens that follow until newer ones push it out. One fetch (a layer's union) never
// evicts a bundle it is using itself: a union larger than the cache keeps what fits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pyinfer {

class NeuronCache {
 public:
  NeuronCache() = default;
  // `layer_neurons[l]`: neurons of layer l (0: layer not cached); slots of `slot_bytes`, `bytes` in all.
  NeuronCache(const std::vector<int64_t>& layer_neurons, uint64_t slot_bytes, uint64_t bytes);
  ~NeuronCache();
  NeuronCache(const NeuronCache&) = delete;
  NeuronCache& operator=(const NeuronCache&) = delete;
  NeuronCache(NeuronCache&& o) noexcept;
  NeuronCache& operator=(NeuronCache&& o) noexcept;

  bool caches(int layer) const { return size_t(layer) < slot_of_.size() && !slot_of_[size_t(layer)].empty(); }
  uint64_t bytes() const { return uint64_t(prev_.size()) * slot_bytes_; }
  // A new fetch begins: bundles it touches or inserts are safe from its own evictions.
  void begin_fetch() { ++stamp_; }
  // The cached bundle of neuron k (and marks it most recent), or nullptr.
  const uint8_t* find(int layer, int64_t k);
  // Copies a bundle in, over the least recent one; false when every slot is in use by this fetch. `evicted`:
  // whether an older neuron was dropped.
  bool insert(int layer, int64_t k, const uint8_t* bundle, uint64_t bundle_bytes, bool& evicted);

 private:
  void touch(int32_t slot);

  uint8_t* mem_ = nullptr;
  uint64_t slot_bytes_ = 0;
  std::vector<std::vector<int32_t>> slot_of_;      // [layer][neuron]: its slot, or -1
  std::vector<int32_t> layer_of_, neuron_of_;      // per slot: what it holds (-1: nothing)
  std::vector<int32_t> prev_, next_;               // toward the head (more recent) / the tail
  std::vector<uint64_t> used_in_;                  // the fetch that last used each slot
  int32_t head_ = -1, tail_ = -1;
  uint64_t stamp_ = 0;
};

}  // namespace pyinfer
