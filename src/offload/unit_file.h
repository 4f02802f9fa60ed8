// A swap file holding this rank's slices of stage-3 units (parameters or gradients): each slice
// starts at a 4096-byte aligned offset, so a unit's slice, or any piece of it starting at a
// multiple of 4096 elements, is one direct (O_DIRECT) request.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "zero/stage3/unit_layout.h"

namespace deepspeed {
namespace offload {
using zero::Stage3Layout;

// Elements per aligned piece inside a unit: a multiple of 4096 keeps every piece's file offset
// aligned whatever the element size.
constexpr int64_t kUnitPieceAlignment = 4096;

class UnitFileLayout {
 public:
  UnitFileLayout() = default;
  // Units [first_unit, U) are in the file, in order.
  UnitFileLayout(const Stage3Layout& layout, int first_unit, int64_t element_size);
  int unit_at(int64_t element) const;          // the file unit holding a partition element
  int64_t offset_of(int64_t element) const;    // its byte offset in the file
  int64_t unit_offset(int unit) const { return offsets_[unit]; }
  int64_t slice_bytes(int unit) const;         // the unit's slice, rounded up to the alignment
  int64_t bytes_for(int64_t numel) const;      // numel elements, rounded up to the alignment
  int64_t file_bytes() const { return file_bytes_; }

 private:
  const Stage3Layout* layout_ = nullptr;
  int first_unit_ = 0;
  int64_t element_size_ = 1;
  std::vector<int64_t> offsets_;  // per unit; -1 for units not in the file
  int64_t file_bytes_ = 0;
};

// Sub-groups of at most sub_group_size elements that never straddle two units and, inside a
// unit, start at multiples of kUnitPieceAlignment elements (rounding sub_group_size up to one).
std::vector<std::pair<int64_t, int64_t>> unit_aligned_groups(const Stage3Layout& layout,
                                                             int64_t sub_group_size);

// A CPU tensor of `numel` elements over page-aligned memory (direct I/O needs it), at least one
// alignment unit long, freed with the tensor.
at::Tensor aligned_tensor(int64_t numel, at::ScalarType dtype);

}  // namespace offload
}  // namespace deepspeed
