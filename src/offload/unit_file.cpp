#include "offload/unit_file.h"

#include <algorithm>
#include <cstdlib>
#include <new>

#include <torch/torch.h>

#include "offload/aligned_buffer.h"

namespace deepspeed {
namespace offload {

UnitFileLayout::UnitFileLayout(const Stage3Layout& layout, int first_unit, int64_t element_size)
    : layout_(&layout), first_unit_(first_unit), element_size_(element_size),
      offsets_(layout.units.size(), -1) {
  for (int u = first_unit; u < static_cast<int>(layout.units.size()); ++u) {
    offsets_[u] = file_bytes_;
    file_bytes_ += slice_bytes(u);
  }
}

int64_t UnitFileLayout::bytes_for(int64_t numel) const {
  return round_up(numel * element_size_, kDirectIoAlignment);
}

int64_t UnitFileLayout::slice_bytes(int unit) const {
  return bytes_for(layout_->units[unit].layout.partition_numel);
}

int UnitFileLayout::unit_at(int64_t element) const {
  int u = first_unit_;
  while (u + 1 < static_cast<int>(layout_->units.size()) &&
         layout_->units[u + 1].partition_offset <= element)
    ++u;
  return u;
}

int64_t UnitFileLayout::offset_of(int64_t element) const {
  const int u = unit_at(element);
  return offsets_[u] + (element - layout_->units[u].partition_offset) * element_size_;
}

std::vector<std::pair<int64_t, int64_t>> unit_aligned_groups(const Stage3Layout& layout,
                                                             int64_t sub_group_size) {
  std::vector<std::pair<int64_t, int64_t>> groups;
  const int64_t piece = round_up(std::max<int64_t>(1, sub_group_size), kUnitPieceAlignment);
  for (const auto& slots : layout.units)
    for (int64_t b = 0; b < slots.layout.partition_numel; b += piece)
      groups.emplace_back(slots.partition_offset + b, std::min(piece, slots.layout.partition_numel - b));
  return groups;
}

at::Tensor aligned_tensor(int64_t numel, at::ScalarType dtype) {
  const int64_t bytes = std::max<int64_t>(round_up(numel * c10::elementSize(dtype), kDirectIoAlignment),
                                          kDirectIoAlignment);
  void* data = nullptr;
  if (posix_memalign(&data, kDirectIoAlignment, static_cast<size_t>(bytes)) != 0) throw std::bad_alloc();
  return at::from_blob(data, {numel}, [](void* p) { std::free(p); }, torch::TensorOptions().dtype(dtype));
}

}  // namespace offload
}  // namespace deepspeed
