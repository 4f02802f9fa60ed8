// ZeRO partition arithmetic: the one pure function the stages, the memory report and checkpoint
// resharding all use, and the one owner of the partition alignment. It sits below both zero/ and
// checkpoint/ (neither includes the other for it).
//
// A flat buffer of `numel` elements is padded to a multiple of world_size * alignment; rank r owns
// the contiguous partition [r * partition_numel, (r + 1) * partition_numel).
#pragma once
#include <algorithm>
#include <cstdint>

namespace deepspeed {
namespace partition {

// Partitions are aligned to 16 elements (64 bytes): whole cache lines and AVX-512 vectors. Every
// flat buffer (stages 0-2), every stage-3 unit and every checkpoint share uses this alignment, so
// a checkpoint's shares line up with the stages' partitions.
constexpr int64_t kAlignment = 16;

struct PartitionLayout {
  int64_t numel = 0;            // real elements
  int64_t padded_numel = 0;     // numel rounded up to world_size * alignment
  int64_t partition_numel = 0;  // padded_numel / world_size
  int world_size = 1;

  int64_t begin(int rank) const { return rank * partition_numel; }
  int64_t end(int rank) const { return (rank + 1) * partition_numel; }
  // Elements of [a, b) that rank owns.
  int64_t overlap(int rank, int64_t a, int64_t b) const {
    return std::max<int64_t>(0, std::min(b, end(rank)) - std::max(a, begin(rank)));
  }
};

// REQUIRES: numel >= 0, world_size >= 1, alignment >= 1.
inline PartitionLayout make_partition_layout(int64_t numel, int world_size,
                                             int64_t alignment = kAlignment) {
  const int64_t unit = world_size * alignment;
  PartitionLayout l;
  l.numel = numel;
  l.padded_numel = std::max<int64_t>(unit, (numel + unit - 1) / unit * unit);
  l.partition_numel = l.padded_numel / world_size;
  l.world_size = world_size;
  return l;
}

}  // namespace partition
using partition::make_partition_layout;
using partition::PartitionLayout;
}  // namespace deepspeed
