#include "zero/step_during_backward.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>

namespace deepspeed {
namespace zero {

StepDuringBackward::StepDuringBackward(optim::FusedAdam& adam, at::Tensor master,
                                       at::Tensor grad_host, at::Tensor upload,
                                       c10::Device partition_device, bool pin)
    : adam_(adam), master_(std::move(master)), grad_host_(std::move(grad_host)),
      upload_(std::move(upload)), device_(partition_device), pin_(pin),
      uploads_(partition_device) {
  grad_host_shared_ = grad_host_.defined();
}

StepDuringBackward::~StepDuringBackward() = default;

int64_t StepDuringBackward::own_bytes() const {
  return grad_host_.defined() && !grad_host_shared_ ? grad_host_.numel() * 4 : 0;
}

at::Tensor StepDuringBackward::host_gradients(int64_t begin, const at::Tensor& grads,
                                              bool blocking) {
  if (grads.is_cpu()) return grads.to(at::kFloat).contiguous();
  if (!grad_host_.defined())  // gradients on a GPU, masters on the host: one landing place
    grad_host_ = at::empty({master_.numel()},
                           at::TensorOptions().dtype(at::kFloat).pinned_memory(pin_));
  at::Tensor slot = grad_host_.narrow(0, begin, grads.numel());
  slot.copy_(grads, /*non_blocking=*/!blocking);
  return slot;
}

void StepDuringBackward::update(int64_t begin, const at::Tensor& host_grads,
                                const at::Tensor& partition) {
  const int64_t n = host_grads.numel();
  step_.run(host_grads.data_ptr<float>(), begin, n);
  if (upload_.defined()) uploads_.copy(partition.narrow(0, begin, n), upload_.narrow(0, begin, n));
}

void StepDuringBackward::take(int64_t begin, const at::Tensor& grads, const at::Tensor& partition) {
  torch::NoGradGuard no_grad;
  const int64_t n = grads.numel();
  if (n == 0) return;
  TORCH_CHECK(begin >= 0 && begin + n <= master_.numel(), "StepDuringBackward: range [", begin,
              ", ", begin + n, ") outside the partition of ", master_.numel());
  if (taken_.empty()) {
    // The step's constants, with the learning rate the scheduler set for it.
    step_ = adam_.prepare_step(master_);
    step_.hyper.num_threads = at::get_num_threads();
  }
  taken_.emplace_back(begin, n);
  at::Tensor host_grads = host_gradients(begin, grads, /*blocking=*/false);
  auto fence = device::CopyFence::record(grads.device());
  worker_.post([this, begin, host_grads, fence, partition] {
    fence->wait();
    update(begin, host_grads, partition);
  });
}

std::vector<std::pair<int64_t, int64_t>> StepDuringBackward::gaps() const {
  auto ranges = taken_;
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t at = 0;
  for (const auto& [begin, numel] : ranges) {
    TORCH_CHECK(begin >= at, "StepDuringBackward: ranges overlap at element ", begin);
    if (begin > at) out.emplace_back(at, begin - at);
    at = begin + numel;
  }
  if (at < master_.numel()) out.emplace_back(at, master_.numel() - at);
  return out;
}

void StepDuringBackward::finish(const at::Tensor& grads, const at::Tensor& partition) {
  torch::NoGradGuard no_grad;
  try {
    worker_.wait();
  } catch (...) {
    taken_.clear();  // the step is lost; the next one starts afresh
    throw;
  }
  for (const auto& [begin, numel] : gaps())
    update(begin, host_gradients(begin, grads.narrow(0, begin, numel), /*blocking=*/true), partition);
  uploads_.join();
  last_ranges_ = taken_.size();
  taken_.clear();
}

}  // namespace zero
}  // namespace deepspeed
