#include "offload/grad_store.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>
#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "util/ranges.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace offload {
namespace {
// Closed slices whose writes may be in flight at once (beyond them, close() waits).
constexpr size_t kMaxWritesInFlight = 2;
// Freed buffers kept for reuse. One: a buffer is freed (its write done, its sub-group updated)
// just before the next one is needed, so a single spare replaces the allocation without adding
// to the peak; the spare is dropped when a micro-step or a step ends.
constexpr size_t kMaxPooled = 1;
}  // namespace

GradStore::GradStore(const Stage3Layout& layout, at::ScalarType dtype, const std::string& dir,
                     const AioConfig& aio, Downloader download)
    : layout_(layout), dtype_(dtype), file_(layout, 0, c10::elementSize(dtype)),
      downloads_(std::move(download)) {
  fd_ = offload::create_swap_file(dir, "zero_optimization.offload_optimizer.nvme_path",
                                  "gradient_swap");
  path_ = fd_->path();
  queue_ = std::make_unique<offload::AioQueue>(
      offload::AioOptions{aio.block_size, static_cast<int>(aio.queue_depth)});
  fd_->resize(file_.file_bytes());
}

GradStore::~GradStore() {
  // Each on its own: a download's fence that throws (a sticky CUDA error) must not skip the wait
  // for the reads and writes still in flight into writing_'s and reading_'s buffers, freed below.
  try {
    drop_downloads();
  } catch (...) {
  }
  try {
    queue_->wait_all();
  } catch (...) {
  }
  writing_.clear();
  reading_.clear();
  fd_.reset();
}

void GradStore::begin_micro_step(bool boundary) {
  // The last backward threw midway. Its buckets stay in the gradients, as they would in a device
  // partition (and in PyTorch's .grad): the downloads still coming are added, every slice it
  // opened goes to the file, and this micro-step adds to them.
  if (in_micro_step_) {
    boundary_ = false;  // its squares are not the norm of anything: this micro-step's will be
    apply_downloads(/*wait_all=*/true);
    // None is pending now: a unit still waiting to complete lost its last add to an error.
    pending_of_.clear();
    completing_.clear();
    std::vector<int> still_open;
    for (const auto& kv : open_) still_open.push_back(kv.first);
    for (int unit : still_open) close(unit);
    finish_writes();
  }
  in_micro_step_ = true;
  boundary_ = boundary;
  if (boundary_) squared_norm_ = 0;
}

at::Tensor GradStore::take_buffer(int64_t numel) {
  for (auto it = pool_.begin(); it != pool_.end(); ++it)
    if (it->numel() == numel) {
      at::Tensor t = std::move(*it);
      pool_.erase(it);
      return t;
    }
  return aligned_tensor(numel, dtype_);
}

void GradStore::recycle(at::Tensor buffer) {
  if (!buffer.defined() || buffer.numel() == 0) return;
  pool_.push_back(std::move(buffer));
  if (pool_.size() > kMaxPooled) pool_.pop_front();
}

GradStore::Open& GradStore::acquire_slice(int unit) {
  auto it = open_.find(unit);
  if (it != open_.end()) return it->second;
  const int64_t n = layout_.units[unit].layout.partition_numel;
  Open o;
  o.slice = take_buffer(n);
  if ((accumulated_ || in_file_.count(unit)) && n > 0)
    queue_->wait(
        queue_->read(*fd_, file_.unit_offset(unit), o.slice.data_ptr(), file_.slice_bytes(unit)));
  else
    o.fresh = true;  // nothing written yet: see `covered`
  Open& out = open_.emplace(unit, std::move(o)).first->second;
  note_resident();
  return out;
}

// The elements of a fresh slice no accumulate wrote become zeros.
void GradStore::zero_uncovered(Open& o) {
  if (!o.fresh) return;
  // Overlapping accumulations into a fresh slice would mean a unit's buckets are not disjoint.
  for (const auto& [first, n] : uncovered(o.covered, o.slice.numel(), "GradStore"))
    o.slice.narrow(0, first, n).zero_();
  o.fresh = false;
  o.covered.clear();
}

void GradStore::accumulate(int unit, int64_t first, const at::Tensor& reduced) {
  downloads_.push(reduced, SlicePlace{unit, first});
  pending_of_[unit]++;
  note_resident();
  apply_downloads(/*wait_all=*/false);
}

void GradStore::unit_complete(int unit) {
  if (pending_of_[unit] > 0) {
    completing_.insert(unit);
    return apply_downloads(/*wait_all=*/false);
  }
  open(unit);
  close(unit);
}

// A unit whose last download this adds, and that unit_complete() found waiting for it, goes to
// the file at once (its slice freed before the next one opens).
void GradStore::apply_downloads(bool wait_all) {
  downloads_.apply(wait_all, [&](const at::Tensor& values, const SlicePlace& to) {
    // Counted off first: a download whose add throws has left the queue all the same.
    const bool last = --pending_of_[to.unit] == 0;
    add_into_slice(to.unit, to.first, values);  // counted resident until added
    if (last && completing_.erase(to.unit)) {
      open(to.unit);
      close(to.unit);
    }
  });
}

// discard() and the destructor: no download is added, but none may still be writing its
// buffer when it is freed.
void GradStore::drop_downloads() {
  downloads_.drop();
  pending_of_.clear();
  completing_.clear();
}

void GradStore::finish_writes() {
  while (!writing_.empty()) wait_oldest_write();
}

// A failed write leaves the file without that unit's gradients: the accumulation is incomplete,
// and get() says so until discard() (an fp16 overflow's drop, or a load) starts a new one.
void GradStore::wait_oldest_write() {
  Io io = std::move(writing_.front());
  writing_.pop_front();
  try {
    queue_->wait(io.ticket);
  } catch (const std::exception& e) {
    if (write_failed_.empty()) write_failed_ = e.what();
    recycle(std::move(io.buffer));
    throw;
  }
  recycle(std::move(io.buffer));
}

void GradStore::check_no_failed_write() const {
  if (!write_failed_.empty())
    throw IOError("gradient swap file '" + path_ + "': a write failed earlier (" + write_failed_ +
                  "), so this accumulation's gradients in it are incomplete and no step can use "
                  "them; free space on offload_optimizer.nvme_path and load the last checkpoint "
                  "(load_checkpoint drops them)");
}

void GradStore::add_into_slice(int unit, int64_t first, const at::Tensor& received) {
  Open& o = acquire_slice(unit);
  const int64_t n = received.numel();
  if (n == 0) return;
  at::Tensor dst = o.slice.narrow(0, first, n);
  if (!o.fresh) {
    dst.add_(received.reshape({-1}));
    return;
  }
  // What 0 + received gives (in the dtype add_ would compute in, -0 becoming +0), without the
  // zeros. REQUIRES (checked at close): this micro-step's ranges are disjoint.
  at::add_out(dst, received.reshape({-1}), at::zeros({}, received.options()));
  o.covered.emplace_back(first, n);
}

at::Tensor GradStore::open(int unit) {
  Open& o = acquire_slice(unit);
  zero_uncovered(o);
  return o.slice;
}

void GradStore::close(int unit) {
  auto it = open_.find(unit);
  if (it == open_.end()) return;
  zero_uncovered(it->second);
  Io io{it->second.slice, -1};
  open_.erase(it);
  if (io.buffer.numel() == 0) {
    if (!accumulated_) in_file_.insert(unit);
    return;
  }
  if (boundary_) squared_norm_ += zero::sum_of_squares(io.buffer).item<double>();
  io.ticket = queue_->write(*fd_, file_.unit_offset(unit), io.buffer.data_ptr(), file_.slice_bytes(unit));
  if (!accumulated_) in_file_.insert(unit);  // (a write that fails later is an IOError then)
  writing_.push_back(std::move(io));
  while (writing_.size() > kMaxWritesInFlight) wait_oldest_write();
}

void GradStore::end_micro_step() {
  apply_downloads(/*wait_all=*/true);
  TORCH_CHECK(completing_.empty() && open_.empty(), "GradStore: ", open_.size() + completing_.size(),
              " unit(s) still open at the end of backward");
  finish_writes();
  pool_.clear();  // forward and the optimizer step need the memory more than a spare
  accumulated_ = true;
  in_file_.clear();
  in_micro_step_ = false;
}

void GradStore::discard() {
  drop_downloads();
  while (!writing_.empty()) {
    try {
      wait_oldest_write();
    } catch (...) {  // dropped with the rest
    }
  }
  write_failed_.clear();
  for (auto& [begin, io] : reading_) {
    if (io.ticket >= 0) queue_->wait(io.ticket);
    recycle(std::move(io.buffer));
  }
  reading_.clear();
  open_.clear();
  pool_.clear();
  accumulated_ = false;
  in_file_.clear();
}

void GradStore::prefetch(int64_t begin, int64_t numel) {
  if (!accumulated_ || reading_.count(begin)) return;
  Io io{take_buffer(numel), -1};
  io.ticket = queue_->read(*fd_, file_.offset_of(begin), io.buffer.data_ptr(), file_.bytes_for(numel));
  reading_.emplace(begin, std::move(io));
  note_resident();
}

at::Tensor GradStore::get(int64_t begin, int64_t numel) {
  check_no_failed_write();  // (a failed end_micro_step also left accumulated_ unset: zeros)
  if (!accumulated_) return torch::zeros({numel}, torch::TensorOptions().dtype(dtype_));
  prefetch(begin, numel);
  auto it = reading_.find(begin);
  Io& io = it->second;
  if (io.ticket >= 0) {
    try {
      queue_->wait(io.ticket);
    } catch (...) {  // the next get() reads it again, not what the failed read left
      recycle(std::move(io.buffer));
      reading_.erase(it);
      throw;
    }
    io.ticket = -1;
  }
  return io.buffer;
}

void GradStore::release(int64_t begin, int64_t) {
  auto it = reading_.find(begin);
  if (it == reading_.end()) return;
  Io io = std::move(it->second);
  reading_.erase(it);  // first: a read that failed is read again by the next get()
  if (io.ticket >= 0) queue_->wait(io.ticket);
  recycle(std::move(io.buffer));
}

int64_t GradStore::resident_bytes() const {
  int64_t total = 0;
  for (auto& [u, o] : open_) total += o.slice.numel() * o.slice.element_size();
  for (auto& io : writing_) total += io.buffer.numel() * io.buffer.element_size();
  for (auto& [b, io] : reading_) total += io.buffer.numel() * io.buffer.element_size();
  return total + downloads_.host_bytes();
}

int64_t GradStore::pending_device_bytes() const { return downloads_.device_bytes(); }

int64_t GradStore::pooled_bytes() const {
  int64_t total = 0;
  for (auto& t : pool_) total += t.numel() * t.element_size();
  return total;
}

void GradStore::note_resident() {
  peak_resident_ = std::max(peak_resident_, resident_bytes());
}

}  // namespace offload
}  // namespace deepspeed
