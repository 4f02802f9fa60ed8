// Page-aligned host memory for direct (O_DIRECT) file I/O, which needs the buffer address, the file
// offset and the length all aligned to the device's logical block size; 4096 covers every device.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

namespace deepspeed::offload {

constexpr int64_t kDirectIoAlignment = 4096;

inline int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // `bytes` is rounded up to kDirectIoAlignment; the memory is zeroed.
  explicit AlignedBuffer(int64_t bytes) : bytes_(round_up(bytes, kDirectIoAlignment)) {
    if (bytes_ == 0) return;
    if (posix_memalign(&data_, kDirectIoAlignment, static_cast<size_t>(bytes_)) != 0)
      throw std::bad_alloc();
    std::fill_n(static_cast<char*>(data_), bytes_, 0);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  void* data() const { return data_; }
  template <class T>
  T* as() const { return static_cast<T*>(data_); }
  int64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace deepspeed::offload
