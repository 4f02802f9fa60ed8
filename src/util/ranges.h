// Element ranges (begin, numel) of a flat buffer. Three owners track which parts of a buffer a
// round of bucket copies has written (the offloaded update's ranges taken during backward, a
// swapped gradient slice, the host gradient partition) and act on the rest: this is their one
// definition of "the rest".
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

namespace deepspeed {

using ElementRange = std::pair<int64_t, int64_t>;  // (begin, numel)

// The parts of [0, total) that no range in `covered` covers, in order. `who` names the caller in
// the error thrown when two ranges overlap (each owner's ranges come from disjoint buckets, so an
// overlap is a bug upstream, not something to paper over).
inline std::vector<ElementRange> uncovered(std::vector<ElementRange> covered, int64_t total,
                                           const char* who) {
  std::sort(covered.begin(), covered.end());
  std::vector<ElementRange> gaps;
  int64_t at = 0;
  for (const auto& [begin, numel] : covered) {
    TORCH_CHECK(begin >= at, who, ": ranges overlap at element ", begin);
    if (begin > at) gaps.emplace_back(at, begin - at);
    at = begin + numel;
  }
  TORCH_CHECK(at <= total, who, ": a range ends at element ", at, ", past the buffer's ", total);
  if (at < total) gaps.emplace_back(at, total - at);
  return gaps;
}

}  // namespace deepspeed
