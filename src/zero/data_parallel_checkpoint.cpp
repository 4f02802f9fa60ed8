// DataParallelStage's side of checkpoints. Its state is replicated, so each rank saves only the
// 1/N share a ZeRO partition would hold (checkpoint/layout.h) and loads every parameter whole.
#include <torch/torch.h>

#include "checkpoint/layout.h"
#include "deepspeed/errors.h"
#include "zero/data_parallel.h"
#include "zero/fragment_state.h"
#include "zero/moment_state.h"

namespace deepspeed {
namespace zero {
namespace {
// The parameters double as the fp32 masters here; with an optimizer a 16-bit parameter would
// mean masters live elsewhere (mixed precision), which this file would have to be taught about:
// refuse loudly rather than save rounded weights and miss the optimizer state keyed on the
// masters. Without one (an engine for evaluation, any stage below 3) the parameters are the only
// copy of the weights: a 16-bit one's fragment is an fp32 copy (saving reads it; loading writes it
// and finish_load narrows it back, DataParallelStage::widened_for_load_).
StateFragment fragment_of(torch::optim::Optimizer* optimizer, const at::Tensor& p, size_t index,
                          int64_t offset, int64_t numel, bool create) {
  if (optimizer && p.scalar_type() != at::kFloat)
    throw CheckpointError("checkpoint: ZeRO stage 0 with " + std::string(c10::toString(p.scalar_type())) +
                          " parameters is not supported by data_parallel_checkpoint.cpp yet");
  StateFragment f;
  f.param = index;
  f.offset = offset;
  f.numel = numel;
  f.master = p.detach().view({-1}).narrow(0, offset, numel);
  if (f.master.scalar_type() != at::kFloat) f.master = f.master.to(at::kFloat);
  if (optimizer) {
    auto [exp_avg, exp_avg_sq] = moments_of(*optimizer, p, create);
    if (exp_avg.defined()) f.exp_avg = exp_avg.narrow(0, offset, numel);
    if (exp_avg_sq.defined()) f.exp_avg_sq = exp_avg_sq.narrow(0, offset, numel);
  }
  return f;
}
}  // namespace

std::unique_ptr<FragmentState> DataParallelStage::state_to_save() {
  std::vector<int64_t> numels;
  for (auto& p : params_) numels.push_back(p.numel());
  std::vector<StateFragment> out;
  for (auto& r : checkpoint::partition_fragments(numels, ctx_.world_size(), ctx_.rank()))
    out.push_back(fragment_of(optimizer_.get(), params_[r.param], r.param, r.offset, r.numel,
                              /*create=*/saves_made_state(moment_family(optimizer_.get()))));
  return view_fragment_state(std::move(out));
}

std::unique_ptr<FragmentState> DataParallelStage::state_to_load(bool create_moments) {
  std::vector<StateFragment> out;
  widened_for_load_.clear();
  for (size_t k = params_.size(); k-- > 0;) {
    out.push_back(
        fragment_of(optimizer_.get(), params_[k], k, 0, params_[k].numel(), create_moments));
    if (!out.back().master.is_alias_of(params_[k]))
      widened_for_load_.emplace_back(params_[k], out.back().master);
  }
  return view_fragment_state(std::move(out));
}

int64_t DataParallelStage::adam_step() const {
  if (!optimizer_ || moment_family(optimizer_.get()) == MomentFamily::kNone) return -1;
  // Every parameter steps in lockstep; one without state yet (no gradient so far) says 0.
  int64_t step = 0;
  for (auto& p : params_) step = std::max(step, moment_step(*optimizer_, p));
  return step;
}

void DataParallelStage::finish_load(int64_t adam_step) {
  {
    torch::NoGradGuard no_grad;
    for (auto& [param, loaded] : widened_for_load_) param.detach().view({-1}).copy_(loaded);
    widened_for_load_.clear();
  }
  if (adam_step < 0 || !optimizer_) return;
  for (auto& p : params_)
    if (moments_of(*optimizer_, p, /*create=*/false)[0].defined())
      set_moment_step(*optimizer_, p, adam_step);
}

}  // namespace zero
}  // namespace deepspeed
