#include "offload/param_store.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include <c10/util/accumulate.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "device/pinned_memory.h"

namespace deepspeed {
namespace offload {
namespace {

// The k-th parameter of a unit as its ZeroUnit registers it ("#k" without one), for errors.
std::string parameter_name(const zero::UnitSlots& slots, size_t k) {
  if (slots.module && k < slots.params.size())
    for (const auto& kv : slots.module->named_parameters())
      if (kv.value().unsafeGetTensorImpl() == slots.params[k].unsafeGetTensorImpl())
        return kv.key();
  return "#" + std::to_string(k);
}

}  // namespace

ParamStore::ParamStore(const Stage3Layout& layout, at::ScalarType dtype, const ZeroConfig& zero,
                       const AioConfig& aio, c10::Device device)
    : layout_(layout),
      dtype_(dtype),
      element_size_(c10::elementSize(dtype)),
      config_(zero.offload_param),
      first_file_unit_(static_cast<int>(layout.units.size())),
      device_(device) {
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
  // Checked before anything is allocated. buffer_count 0 is a valid key (DeepSpeed's ge=0) that
  // only a store with units in the file cannot work with.
  for (int u = first_file_unit_; u < units; ++u) {
    pool_numel_ = std::max(pool_numel_, layout_.units[u].layout.partition_numel);
    check_buffer_size(u);
  }
  if (first_file_unit_ < units && config_.buffer_count < 1)
    throw ConfigError(fmt::format(
        "zero_optimization.offload_param.buffer_count must be >= 1 when units are swapped to "
        "nvme_path (device \"nvme\", beyond max_in_cpu), got {}",
        config_.buffer_count));
  // offload_param "cpu"/"nvme" keep the slices in host memory; "none" keeps them on `device`.
  // With a GPU as the compute device that host memory is page-locked whatever pin_memory says,
  // as in DeepSpeed (its stage-3 optimizer pins the flat CPU buffer of the partition, its
  // parameter swapper its buffers): every gather uploads a unit's slice from here, and from
  // pageable memory that upload would be a blocking copy.
  pin_ = device.is_cuda();
  if (config_.device == "none" || config_.device.empty()) {
    memory_ = torch::zeros({memory_numel_}, torch::TensorOptions().dtype(dtype_).device(device));
  } else {
    memory_ = pinned_if_gpu(memory_numel_, "parameter partition kept in memory");
    memory_.zero_();
  }
  if (first_file_unit_ >= units) return;

  file_ = UnitFileLayout(layout_, first_file_unit_, element_size_);
  fd_ = offload::create_swap_file(config_.nvme_path, "zero_optimization.offload_param.nvme_path",
                                  "param_swap");
  path_ = fd_->path();
  queue_ = std::make_unique<offload::AioQueue>(
      offload::AioOptions{aio.block_size, static_cast<int>(aio.queue_depth)});
  fd_->resize(file_.file_bytes());
}

// DeepSpeed's parameter swapper gives each parameter's partition (ceil(numel / world size)
// elements) one buffer and asserts numel < buffer_size (partitioned_param_swapper.py,
// get_buffer). Here a unit's slice is read into one pool buffer sized to the largest file slice,
// so buffer_size sizes nothing: it refuses exactly what DeepSpeed refuses, and no more (a block
// of a large model as one unit is many times buffer_size). A layout without parameters (tests'
// hand-made ones) counts the unit's slice as one parameter.
void ParamStore::check_buffer_size(int unit) const {
  const auto& slots = layout_.units[unit];
  auto refuse = [&](const std::string& what, int64_t slice) {
    if (slice < config_.buffer_size) return;
    throw ConfigError(fmt::format(
        "zero_optimization.offload_param.buffer_size is {} elements, not more than the {} "
        "elements of this rank's partition of {} in ZeRO-3 unit {} (as in DeepSpeed, each "
        "parameter's partition must be smaller than buffer_size): raise it to at least {}",
        config_.buffer_size, slice, what, unit, slice + 1));
  };
  if (slots.shapes.empty()) return refuse("all its parameters", slots.layout.partition_numel);
  const int64_t world = slots.layout.world_size;
  for (size_t k = 0; k < slots.shapes.size(); ++k) {
    const int64_t numel = c10::multiply_integers(slots.shapes[k]);
    refuse(fmt::format("parameter '{}' ({} elements)", parameter_name(slots, k), numel),
           (numel + world - 1) / world);
  }
}

at::Tensor ParamStore::pinned_if_gpu(int64_t numel, const char* what) const {
  try {
    return device::host_buffer(numel, dtype_, pin_, device_);
  } catch (const Error& e) {
    throw Error(fmt::format(
        "zero_optimization.offload_param: the {} ({} bytes) is page-locked on a GPU whatever "
        "offload_param.pin_memory says (as DeepSpeed does; setting it false does not avoid this), "
        "and the driver refused: {}",
        what, numel * element_size_, e.what()));
  }
}

ParamStore::~ParamStore() {
  if (!fd_) return;
  try {
    queue_->wait_all();
  } catch (...) {
  }
  for (auto& f : free_) {
    try {
      if (f.readers) f.readers->wait();
    } catch (...) {
    }
  }
  fetched_.clear();
  fd_.reset();
}

// A new pool buffer while fewer than buffer_count exist, else the free one handed back longest
// ago (its copy the likeliest to be done; waited for if not), else a one-off of the slice's size
// (fetch() past the prefetch bound). Page-aligned either way, for O_DIRECT.
ParamStore::Fetch ParamStore::start_read(int unit) {
  const int64_t n = layout_.units[unit].layout.partition_numel;
  Fetch f;
  if (pooled_ < config_.buffer_count) {
    f.buffer = pin_ ? pinned_if_gpu(pool_numel_, "NVMe slice buffer")
                    : aligned_tensor(pool_numel_, dtype_);
    ++pooled_;
    f.pooled = true;
  } else if (!free_.empty()) {
    FreeBuffer b = std::move(free_.front());
    free_.erase(free_.begin());
    if (b.readers) b.readers->wait();
    f.buffer = std::move(b.buffer);
    f.pooled = true;
  } else {
    f.buffer = aligned_tensor(n, dtype_);
  }
  f.slice = f.buffer.narrow(0, 0, n);
  if (n > 0)
    f.ticket = queue_->read(*fd_, file_.unit_offset(unit), f.slice.data_ptr(), file_.slice_bytes(unit));
  return f;
}

at::Tensor ParamStore::fetch(int unit) {
  const auto& slots = layout_.units[unit];
  if (in_memory(unit)) return memory_.narrow(0, slots.partition_offset, slots.layout.partition_numel);
  auto it = fetched_.find(unit);
  if (it == fetched_.end()) it = fetched_.emplace(unit, start_read(unit)).first;
  if (it->second.ticket >= 0) {
    try {
      queue_->wait(it->second.ticket);
    } catch (...) {
      drop_failed(it);  // the next fetch reads it again, not the half-read buffer
      throw;
    }
    it->second.ticket = -1;
  }
  it->second.held = true;
  return it->second.slice;
}

void ParamStore::take_back_held(const char* what, int only) {
  auto held = [&] {
    for (auto& [u, f] : fetched_)
      if (f.held && (only < 0 || u == only)) return u;
    return -1;
  };
  if (held() < 0) return;
  if (hand_back_) hand_back_();
  const int u = held();
  if (u >= 0)
    throw std::logic_error(fmt::format(
        "ParamStore::{}: the slice of unit {} is still held (fetched, and done() not called): its "
        "buffer may still be read by a gather or an upload, so the store cannot recycle it",
        what, u));
}

// A read that failed: its buffer goes back to the pool (nothing reads it) and the unit counts as
// not fetched. The queue forgets a ticket once it has reported it, so an entry kept would hand
// out what the failed read left in the buffer.
void ParamStore::drop_failed(std::map<int, Fetch>::iterator it) {
  if (it->second.pooled) free_.push_back({std::move(it->second.buffer), nullptr});
  fetched_.erase(it);
}

bool ParamStore::start_fetch(int unit) {
  if (in_memory(unit) || fetched_.count(unit)) return true;
  if (static_cast<int64_t>(fetched_.size()) >= config_.buffer_count) return false;
  fetched_.emplace(unit, start_read(unit));
  return true;
}

void ParamStore::done(int unit, std::shared_ptr<device::CopyFence> readers) {
  auto it = fetched_.find(unit);
  if (it == fetched_.end()) return;
  Fetch& f = it->second;
  f.held = false;
  if (f.ticket >= 0) {
    try {
      queue_->wait(f.ticket);
    } catch (...) {
      drop_failed(it);
      throw;
    }
  }
  if (f.pooled)
    free_.push_back({std::move(f.buffer), std::move(readers)});
  else if (readers)
    readers->wait();  // a one-off is freed now
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
  take_back_held("write", unit);
  done(unit);  // a fetched copy would now be stale
  at::Tensor staged = aligned_tensor(slice.numel(), dtype_);
  staged.copy_(slice.reshape({-1}));
  queue_->wait(queue_->write(*fd_, file_.unit_offset(unit), staged.data_ptr(), file_.slice_bytes(unit)));
}

at::Tensor ParamStore::read_all() {
  if (!swapped()) return memory_.clone();
  take_back_held("read_all", /*only=*/-1);
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
  at::Tensor out = aligned_tensor(numel, dtype_);
  queue_->wait(queue_->read(*fd_, file_.offset_of(begin), out.data_ptr(), file_.bytes_for(numel)));
  return out;
}

void* ParamStore::begin_group(int64_t begin, int64_t numel) {
  if (begin < memory_numel_ && !memory_.is_cpu()) {
    // Slices on a GPU: the swapped optimizer writes on the host, end_group copies them up.
    if (device_stage_.numel() < numel)
      device_stage_ = device::host_buffer(numel, dtype_, /*pin=*/true, memory_.device());
    return device_stage_.data_ptr();
  }
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
  if (begin < memory_numel_ && !memory_.is_cpu())
    memory_.narrow(0, begin, numel).copy_(device_stage_.narrow(0, 0, numel));
  if (begin < memory_numel_) return;
  const int s = staging_next_;
  // A copy fetched before the step would now be stale. Nothing holds one here: the stage's
  // step began with UnitGatherer::before_store_changes(). The step is half done at this point,
  // so a held slice is a logic_error here rather than a hand-back in the middle of it.
  const int unit = file_.unit_at(begin);
  auto it = fetched_.find(unit);
  if (it != fetched_.end() && it->second.held)
    throw std::logic_error(fmt::format(
        "ParamStore::end_group: the slice of unit {} is still held while the step writes it", unit));
  done(unit);
  staging_write_[s] = queue_->write(*fd_, file_.offset_of(begin), staging_[s].data(), file_.bytes_for(numel));
  staging_next_ = 1 - s;
}

void ParamStore::finish() {
  for (auto& t : staging_write_)
    if (t >= 0) queue_->wait(std::exchange(t, -1));
}

int64_t ParamStore::resident_bytes() const {
  int64_t total = memory_numel_ * element_size_ + pooled_ * pool_numel_ * element_size_;
  for (auto& [u, f] : fetched_)
    if (!f.pooled) total += f.slice.numel() * element_size_;
  // The optimizer sink's staging, kept for the store's life once the step has used it.
  return total + staging_[0].bytes() + staging_[1].bytes() + device_stage_bytes();
}

int64_t ParamStore::host_bytes() const {
  return on_host() ? resident_bytes() : device_stage_bytes();
}

int64_t ParamStore::device_stage_bytes() const {
  return device_stage_.defined() ? device_stage_.numel() * element_size_ : 0;
}

}  // namespace offload
}  // namespace deepspeed
