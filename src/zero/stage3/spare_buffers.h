// Stage 3's released unit buffers in host memory, kept for the next gather of the same size
// instead of freed. glibc maps a block over 32 MiB (its largest mmap threshold, which
// util/host_allocator.h sets) and unmaps it at free, so without this every gather of a large unit
// (a 1024-wide GPT block in fp32: 50 MB) page-faults its whole buffer in again: 27% of a 2-rank
// ZeRO-3 step's samples on the 2-core VM (docs/benchmarks.md, "Host allocator"). On a GPU the CUDA
// caching allocator already does this, so only CPU buffers are kept, and only those of at least
// `min_bytes` (UnitGatherer: kSpareMinBytes, the 32 MiB above which glibc maps): smaller ones come
// from malloc's heap, which keeps freed memory for reuse already.
//
// The caller bounds what is kept (UnitGatherer: together with the gathered units within
// stage3_max_live_parameters, and at most max(stage3_prefetch_bucket_size, the largest unit)
// elements), and counts kept bytes as gathered memory.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace deepspeed {
namespace zero {

// glibc's largest mmap threshold: host buffers at least this large are mapped and unmapped.
constexpr int64_t kSpareMinBytes = int64_t{32} << 20;

class SpareBuffers {
 public:
  explicit SpareBuffers(int64_t min_bytes = kSpareMinBytes) : min_bytes_(min_bytes) {}
  // A kept buffer of exactly `numel` elements of `options`' dtype on the CPU (taken out of the
  // set), or an undefined tensor.
  at::Tensor take(int64_t numel, const at::TensorOptions& options);
  // Whether `buffer` is worth keeping: a contiguous CPU tensor of at least min_bytes whose storage
  // nothing else references (no parameter, autograd saved view or collective points into it).
  bool worth_keeping(const at::Tensor& buffer) const;
  // Keeps `buffer` (REQUIRES worth_keeping(buffer)).
  void keep(at::Tensor buffer);
  // Frees kept buffers, oldest first, until at most `numel` elements are kept.
  void shrink_to(int64_t numel);
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return bytes_; }

 private:
  int64_t min_bytes_;
  std::vector<at::Tensor> kept_;  // oldest first
  int64_t numel_ = 0, bytes_ = 0;
};

}  // namespace zero
}  // namespace deepspeed
