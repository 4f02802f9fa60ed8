#include "zero/stage3/param_store.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <torch/torch.h>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace zero {
namespace {
using offload::kDirectIoAlignment;
using offload::round_up;

// Elements per aligned piece inside a file unit: a multiple of 4096 keeps every piece's file
// offset aligned whatever the element size.
constexpr int64_t kAlignedElements = 4096;
}  // namespace

ParamStore::ParamStore(const Stage3Layout& layout, at::ScalarType dtype, const ZeroConfig& zero,
                       const AioConfig& aio)
    : layout_(layout),
      dtype_(dtype),
      element_size_(c10::elementSize(dtype)),
      config_(zero.offload_param),
      first_file_unit_(static_cast<int>(layout.units.size())) {
  const int units = static_cast<int>(layout_.units.size());
  if (config_.device == "nvme") {
    // The root (always gathered) and a prefix of units up to max_in_cpu elements stay in memory.
    int64_t kept = 0;
    first_file_unit_ = 1;
    while (first_file_unit_ < units &&
           kept + layout_.units[first_file_unit_].layout.partition_numel <= config_.max_in_cpu)
      kept += layout_.units[first_file_unit_++].layout.partition_numel;
  }
  memory_numel_ = first_file_unit_ < units ? layout_.units[first_file_unit_].partition_offset
                                           : layout_.partition_numel;
  memory_ = torch::zeros({memory_numel_}, torch::TensorOptions().dtype(dtype_));
  if (first_file_unit_ >= units) return;

  unit_file_offset_.assign(units, -1);
  for (int u = first_file_unit_; u < units; ++u) {
    const int64_t n = layout_.units[u].layout.partition_numel;
    if (n > config_.buffer_size)
      throw ConfigError(fmt::format(
          "zero_optimization.offload_param.buffer_size is {} elements, smaller than this rank's "
          "slice of ZeRO-3 unit {} ({} elements): raise it to at least {}",
          config_.buffer_size, u, n, n));
    unit_file_offset_[u] = file_bytes_;
    file_bytes_ += slice_bytes(u);
  }
  if (config_.buffer_count < 1)
    throw ConfigError(fmt::format("zero_optimization.offload_param.buffer_count must be >= 1, got {}",
                                  config_.buffer_count));
  path_ = offload::unique_swap_path(config_.nvme_path, "zero_optimization.offload_param.nvme_path",
                                    "param_swap");
  file_ = offload::DirectFile::create(path_);
  queue_ = std::make_unique<offload::AioQueue>(
      offload::AioOptions{aio.block_size, static_cast<int>(aio.queue_depth)});
  // Size the file now: a disk without room for it fails here, naming the file.
  if (::ftruncate(file_->fd(), file_bytes_) != 0)
    throw IOError(fmt::format("cannot size parameter swap file '{}' to {} bytes: {}", path_,
                              file_bytes_, std::strerror(errno)));
}

ParamStore::~ParamStore() {
  if (!file_) return;
  try {
    queue_->wait_all();
  } catch (...) {
  }
  fetched_.clear();
  file_.reset();
  ::unlink(path_.c_str());
}

int64_t ParamStore::slice_bytes(int unit) const {
  return round_up(layout_.units[unit].layout.partition_numel * element_size_, kDirectIoAlignment);
}

// A CPU tensor over page-aligned memory (direct I/O needs it), freed with the tensor.
at::Tensor ParamStore::aligned_tensor(int64_t numel) const {
  const int64_t bytes = std::max<int64_t>(round_up(numel * element_size_, kDirectIoAlignment),
                                          kDirectIoAlignment);
  void* data = nullptr;
  if (posix_memalign(&data, kDirectIoAlignment, static_cast<size_t>(bytes)) != 0) throw std::bad_alloc();
  return at::from_blob(data, {numel}, [](void* p) { std::free(p); },
                       torch::TensorOptions().dtype(dtype_));
}

int ParamStore::unit_at(int64_t element) const {
  int u = first_file_unit_;
  while (u + 1 < static_cast<int>(layout_.units.size()) &&
         layout_.units[u + 1].partition_offset <= element)
    ++u;
  return u;
}

int64_t ParamStore::file_offset(int64_t element) const {
  const int u = unit_at(element);
  return unit_file_offset_[u] + (element - layout_.units[u].partition_offset) * element_size_;
}

at::Tensor ParamStore::fetch(int unit) {
  const auto& slots = layout_.units[unit];
  if (in_memory(unit)) return memory_.narrow(0, slots.partition_offset, slots.layout.partition_numel);
  auto it = fetched_.find(unit);
  if (it == fetched_.end()) {
    Fetch f;
    f.slice = aligned_tensor(slots.layout.partition_numel);
    if (f.slice.numel() > 0)
      f.ticket = queue_->read(*file_, unit_file_offset_[unit], f.slice.data_ptr(), slice_bytes(unit));
    it = fetched_.emplace(unit, std::move(f)).first;
  }
  if (it->second.ticket >= 0) {
    queue_->wait(it->second.ticket);
    it->second.ticket = -1;
  }
  return it->second.slice;
}

bool ParamStore::start_fetch(int unit) {
  if (in_memory(unit) || fetched_.count(unit)) return true;
  if (static_cast<int64_t>(fetched_.size()) >= config_.buffer_count) return false;
  Fetch f;
  f.slice = aligned_tensor(layout_.units[unit].layout.partition_numel);
  if (f.slice.numel() > 0)
    f.ticket = queue_->read(*file_, unit_file_offset_[unit], f.slice.data_ptr(), slice_bytes(unit));
  fetched_.emplace(unit, std::move(f));
  return true;
}

void ParamStore::done(int unit) {
  auto it = fetched_.find(unit);
  if (it == fetched_.end()) return;
  if (it->second.ticket >= 0) queue_->wait(it->second.ticket);
  fetched_.erase(it);
}

void ParamStore::write(int unit, const at::Tensor& slice) {
  const auto& slots = layout_.units[unit];
  TORCH_CHECK(slice.numel() == slots.layout.partition_numel, "ParamStore::write: unit ", unit,
              " slice has ", slots.layout.partition_numel, " elements, got ", slice.numel());
  torch::NoGradGuard no_grad;
  if (in_memory(unit)) {
    memory_.narrow(0, slots.partition_offset, slice.numel()).copy_(slice.reshape({-1}));
    return;
  }
  if (slice.numel() == 0) return;
  done(unit);  // a fetched copy would now be stale
  at::Tensor staged = aligned_tensor(slice.numel());
  staged.copy_(slice.reshape({-1}));
  queue_->wait(queue_->write(*file_, unit_file_offset_[unit], staged.data_ptr(), slice_bytes(unit)));
}

at::Tensor ParamStore::read_all() {
  if (!swapped()) return memory_.clone();
  at::Tensor all = torch::empty({layout_.partition_numel}, torch::TensorOptions().dtype(dtype_));
  all.narrow(0, 0, memory_numel_).copy_(memory_);
  for (int u = first_file_unit_; u < static_cast<int>(layout_.units.size()); ++u) {
    const auto& slots = layout_.units[u];
    all.narrow(0, slots.partition_offset, slots.layout.partition_numel).copy_(fetch(u));
    done(u);
  }
  return all;
}

void ParamStore::write_all(const at::Tensor& partition) {
  TORCH_CHECK(partition.numel() == layout_.partition_numel, "ParamStore::write_all: expected ",
              layout_.partition_numel, " elements, got ", partition.numel());
  for (int u = 0; u < static_cast<int>(layout_.units.size()); ++u) {
    const auto& slots = layout_.units[u];
    write(u, partition.narrow(0, slots.partition_offset, slots.layout.partition_numel));
  }
}

at::Tensor ParamStore::read_group(int64_t begin, int64_t numel) {
  if (begin < memory_numel_) return memory_.narrow(0, begin, numel);
  at::Tensor out = aligned_tensor(numel);
  queue_->wait(queue_->read(*file_, file_offset(begin), out.data_ptr(),
                            round_up(numel * element_size_, kDirectIoAlignment)));
  return out;
}

std::vector<std::pair<int64_t, int64_t>> ParamStore::swap_groups(int64_t sub_group_size) const {
  std::vector<std::pair<int64_t, int64_t>> groups;
  const int64_t size = std::max<int64_t>(1, sub_group_size);
  for (int64_t b = 0; b < memory_numel_; b += size)
    groups.emplace_back(b, std::min(size, memory_numel_ - b));
  const int64_t piece = round_up(size, kAlignedElements);
  for (int u = first_file_unit_; u < static_cast<int>(layout_.units.size()); ++u) {
    const auto& slots = layout_.units[u];
    for (int64_t b = 0; b < slots.layout.partition_numel; b += piece)
      groups.emplace_back(slots.partition_offset + b,
                          std::min(piece, slots.layout.partition_numel - b));
  }
  return groups;
}

void* ParamStore::begin_group(int64_t begin, int64_t numel) {
  if (begin < memory_numel_) return static_cast<char*>(memory_.data_ptr()) + begin * element_size_;
  const int s = staging_next_;
  if (staging_write_[s] >= 0) {
    queue_->wait(staging_write_[s]);
    staging_write_[s] = -1;
  }
  const int64_t bytes = round_up(numel * element_size_, kDirectIoAlignment);
  if (staging_[s].bytes() < bytes) staging_[s] = offload::AlignedBuffer(bytes);
  return staging_[s].data();
}

void ParamStore::end_group(int64_t begin, int64_t numel) {
  if (begin < memory_numel_) return;
  const int s = staging_next_;
  const int u = unit_at(begin);
  done(u);  // a copy fetched before the step would now be stale
  staging_write_[s] = queue_->write(*file_, file_offset(begin), staging_[s].data(),
                                    round_up(numel * element_size_, kDirectIoAlignment));
  staging_next_ = 1 - s;
}

void ParamStore::finish() {
  for (auto& t : staging_write_)
    if (t >= 0) queue_->wait(std::exchange(t, -1));
}

int64_t ParamStore::resident_bytes() const {
  int64_t total = memory_numel_ * element_size_;
  for (auto& [u, f] : fetched_) total += f.slice.numel() * element_size_;
  return total;
}

}  // namespace zero
}  // namespace deepspeed
