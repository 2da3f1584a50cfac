#include "engine/buffer.h"

#include <sys/mman.h>

#include <cstring>
#include <new>
#include <utility>

namespace pyinfer {

Buffer::Buffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  data_ = p;
}

void Buffer::prefault() {
  if (data_) std::memset(data_, 0, size_);
}

Buffer::~Buffer() {
  if (data_) munmap(data_, size_);
}

Buffer::Buffer(Buffer&& o) noexcept : data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
  return *this;
}

}  // namespace pyinfer
