#include "offload/neuron_cache.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>

namespace pyinfer {

NeuronCache::NeuronCache(const std::vector<int64_t>& layer_neurons, uint64_t slot_bytes, uint64_t bytes)
    : slot_bytes_(slot_bytes) {
  const uint64_t n = slot_bytes ? bytes / slot_bytes : 0;
  if (n > uint64_t(INT32_MAX)) throw std::invalid_argument("neuron cache too large");
  if (n == 0) return;
  mem_ = static_cast<uint8_t*>(std::malloc(size_t(n * slot_bytes)));
  if (!mem_) throw std::bad_alloc();
  slot_of_.resize(layer_neurons.size());
  for (size_t l = 0; l < layer_neurons.size(); ++l) slot_of_[l].assign(size_t(layer_neurons[l]), -1);
  layer_of_.assign(size_t(n), -1);
  neuron_of_.assign(size_t(n), -1);
  used_in_.assign(size_t(n), 0);
  prev_.resize(size_t(n));
  next_.resize(size_t(n));
  for (int32_t i = 0; i < int32_t(n); ++i) {  // every slot in the list, empty ones toward the tail
    prev_[size_t(i)] = i - 1;
    next_[size_t(i)] = i + 1 < int32_t(n) ? i + 1 : -1;
  }
  head_ = 0;
  tail_ = int32_t(n) - 1;
}

NeuronCache::~NeuronCache() { std::free(mem_); }

NeuronCache::NeuronCache(NeuronCache&& o) noexcept { *this = std::move(o); }

NeuronCache& NeuronCache::operator=(NeuronCache&& o) noexcept {
  std::swap(mem_, o.mem_);
  std::swap(slot_bytes_, o.slot_bytes_);
  std::swap(slot_of_, o.slot_of_);
  std::swap(layer_of_, o.layer_of_);
  std::swap(neuron_of_, o.neuron_of_);
  std::swap(prev_, o.prev_);
  std::swap(next_, o.next_);
  std::swap(used_in_, o.used_in_);
  std::swap(head_, o.head_);
  std::swap(tail_, o.tail_);
  std::swap(stamp_, o.stamp_);
  return *this;
}

void NeuronCache::touch(int32_t slot) {
  used_in_[size_t(slot)] = stamp_;
  if (slot == head_) return;
  const int32_t p = prev_[size_t(slot)], n = next_[size_t(slot)];  // unlink (p >= 0: not the head)
  next_[size_t(p)] = n;
  if (n >= 0) prev_[size_t(n)] = p; else tail_ = p;
  prev_[size_t(slot)] = -1;  // relink at the head
  next_[size_t(slot)] = head_;
  prev_[size_t(head_)] = slot;
  head_ = slot;
}

const uint8_t* NeuronCache::find(int layer, int64_t k) {
  const int32_t slot = slot_of_[size_t(layer)][size_t(k)];
  if (slot < 0) return nullptr;
  touch(slot);
  return mem_ + uint64_t(slot) * slot_bytes_;
}

bool NeuronCache::insert(int layer, int64_t k, const uint8_t* bundle, uint64_t bundle_bytes, bool& evicted) {
  const int32_t slot = tail_;
  evicted = false;
  // The least recent slot was used by this fetch, so all were: keep the rows the compute points at.
  if (used_in_[size_t(slot)] == stamp_) return false;
  evicted = layer_of_[size_t(slot)] >= 0;
  if (evicted) slot_of_[size_t(layer_of_[size_t(slot)])][size_t(neuron_of_[size_t(slot)])] = -1;
  std::memcpy(mem_ + uint64_t(slot) * slot_bytes_, bundle, size_t(bundle_bytes));
  layer_of_[size_t(slot)] = layer;
  neuron_of_[size_t(slot)] = int32_t(k);
  slot_of_[size_t(layer)][size_t(k)] = slot;
  touch(slot);
  return true;
}

}  // namespace pyinfer
