#include "runtime/unused_parameters.h"

#include <torch/torch.h>

#include "deepspeed/errors.h"

namespace deepspeed {

namespace {
constexpr size_t kNamesShown = 10;
}  // namespace

UnusedParameterCheck::UnusedParameterCheck(const std::vector<at::Tensor>& trainable,
                                           std::vector<std::string> names)
    : names_(std::move(names)), got_gradient_(trainable.size(), 0) {
  for (size_t k = 0; k < trainable.size(); ++k)
    hooks_.add(trainable[k], [this, k] { got_gradient_[k] = 1; });
}

void UnusedParameterCheck::check_step(comm::Communicator& comm, comm::Communicator& job,
                                      c10::Device device) {
  // 1 where this rank's backward passes gave no gradient; summed, nonzero where some rank's did
  // not: every rank then throws alike.
  at::Tensor missing = torch::zeros({static_cast<int64_t>(got_gradient_.size())}, torch::kFloat);
  auto* flags = missing.data_ptr<float>();
  for (size_t k = 0; k < got_gradient_.size(); ++k) flags[k] = got_gradient_[k] ? 0.f : 1.f;
  if (device != missing.device()) missing = missing.to(device);
  if (comm.world_size() > 1) comm.all_reduce(missing)->wait();
  missing = missing.to(at::kCPU);
  std::vector<std::string> unused;
  for (size_t k = 0; k < names_.size(); ++k)
    if (missing.data_ptr<float>()[k] > 0.f) unused.push_back(names_[k]);
  // The other pipeline stages (and tensor ranks) hold other parameters: one more all-reduce, of
  // a count, over the whole job, so that the other stages fail with the same error instead of
  // going on into the step's collectives and failing there because this stage's ranks left.
  bool elsewhere = false;
  if (job.world_size() > comm.world_size()) {
    at::Tensor count = torch::full({1}, static_cast<float>(unused.size()), torch::kFloat);
    if (device != count.device()) count = count.to(device);
    job.all_reduce(count)->wait();
    elsewhere = unused.empty() && count.to(at::kCPU).item<float>() > 0.f;
  }
  if (elsewhere)
    throw ConfigError(
        "zero_optimization.ignore_unused_parameters is false, and trainable parameters of "
        "another pipeline stage or tensor-parallel rank got no gradient from this step's "
        "backward passes (its ranks name them); this rank's step fails with it");
  if (unused.empty()) {
    std::fill(got_gradient_.begin(), got_gradient_.end(), 0);
    return;
  }
  std::string listed;
  for (size_t i = 0; i < unused.size() && i < kNamesShown; ++i)
    listed += (i ? ", " : "") + unused[i];
  if (unused.size() > kNamesShown)
    listed += " and " + std::to_string(unused.size() - kNamesShown) + " more";
  throw ConfigError(
      "zero_optimization.ignore_unused_parameters is false, and " +
      std::to_string(unused.size()) + " trainable parameter" + (unused.size() > 1 ? "s" : "") +
      " got no gradient from this step's backward passes" +
      (comm.world_size() > 1 ? " (on at least one data-parallel rank)" : "") + ": " + listed +
      ". Use them in the loss, freeze them (requires_grad false), or set "
      "ignore_unused_parameters true (the default: they then step with a zero gradient)");
}

}  // namespace deepspeed
