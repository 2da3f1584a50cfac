// Page-aligned, lazily zeroed memory: untouched pages cost no RSS, which keeps a large KV cache
// or logits buffer free until it is used.
#pragma once
#include <cstddef>

namespace pyinfer {

class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Touches every page now (they hold zeros either way), so the memory is resident from the start.
  void prefault();
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace pyinfer
