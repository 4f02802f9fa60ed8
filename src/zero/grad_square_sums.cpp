// ZeroStage::grad_square_sums: the squared gradient norm cut in two by parameter, for tensor
// parallelism (tp/tp_stage.h), where a split parameter's pieces are summed over the
// tensor-parallel group and a replicated parameter is counted once. And the base's
// global_grad_norm_tensor, for the stages that can only give the norm as a value.
#include <torch/torch.h>

#include <unordered_set>

#include "deepspeed/errors.h"
#include "zero/data_parallel.h"
#include "zero/flat_stage.h"
#include "zero/stage.h"
#include "zero/stage3/stage3.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {
namespace {

std::unordered_set<const void*> identities(const std::vector<at::Tensor>& params) {
  std::unordered_set<const void*> out;
  for (auto& p : params) out.insert(p.unsafeGetTensorImpl());
  return out;
}

}  // namespace

at::Tensor ZeroStage::global_grad_norm_tensor() {
  return torch::full({1}, global_grad_norm(), torch::kDouble);
}

at::Tensor ZeroStage::grad_square_sums(const std::vector<at::Tensor>&) {
  throw ConfigError(
      "tensor parallelism: this ZeRO stage cannot split its gradient norm by "
      "parameter (zero_optimization.stage 0, 1 or 2 can)");
}

// The owner's gradient partition is a slice of the flat buffer: each parameter's part of it is
// the overlap of its slot with the partition. Partitions are disjoint, so the sums add over the
// data-parallel group.
at::Tensor FlatStage::grad_square_sums(const std::vector<at::Tensor>& selected) {
  const auto chosen = identities(selected);
  const auto& layout = flat_->layout();
  const int64_t begin = layout.begin(ownership_->owner()), end = begin + layout.partition_numel;
  at::Tensor sums = torch::zeros({2}, ctx_.options(torch::kDouble));
  grads_->settle();
  const at::Tensor& grads = grads_->partition();
  for (const auto& slot : flat_->slots()) {
    const int64_t lo = std::max(begin, slot.offset), hi = std::min(end, slot.offset + slot.numel);
    if (lo >= hi) continue;
    const int which = chosen.count(slot.param.unsafeGetTensorImpl()) ? 0 : 1;
    sums[which] += sum_of_squares(grads.narrow(0, lo - begin, hi - lo));
  }
  ownership_->sum_over_owners(sums);
  return sums;
}

// Every rank holds the averaged gradients whole: the local sums are the group's.
at::Tensor DataParallelStage::grad_square_sums(const std::vector<at::Tensor>& selected) {
  const auto chosen = identities(selected);
  at::Tensor sums = torch::zeros({2}, ctx_.options(torch::kDouble));
  for (auto& p : params_)
    if (p.grad().defined())
      sums[chosen.count(p.unsafeGetTensorImpl()) ? 0 : 1] += sum_of_squares(p.grad());
  return sums;
}

// Stage 3: this rank's gradient partition holds its slice of every unit, laid out as its
// checkpoint fragments (`at`: where each lies in the partition); slices are disjoint over the
// data-parallel group, so the sums add over it.
at::Tensor Stage3::grad_square_sums(const std::vector<at::Tensor>& selected) {
  const ShardGrads partition = grads_->for_step();
  // initialize() refuses this combination before anything is built (tp::check_initialize_args);
  // the guard stays for a stage wrapped by other means.
  if (!partition.tensor.defined())
    throw ConfigError(
        "tensor parallelism with zero_optimization.offload_optimizer.device = nvme "
        "at stage 3 is not supported (the gradient partition is on disk, its norm "
        "cannot be split by parameter)");
  const auto chosen = identities(selected);
  std::vector<bool> split(param_index_.size());
  for (const auto& [impl, index] : param_index_) split.at(index) = chosen.count(impl) > 0;
  at::Tensor sums = torch::zeros({2}, ctx_.options(torch::kDouble));
  const at::Tensor& grads = partition.tensor;
  for (const auto& f : own_fragments())
    sums[split.at(f.param) ? 0 : 1] += sum_of_squares(grads.narrow(0, f.at, f.numel));
  ctx_.comm->all_reduce(sums)->wait();
  return sums;
}

}  // namespace zero
}  // namespace deepspeed
