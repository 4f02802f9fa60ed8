#include "offload/swapped_shard.h"

#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "optim/fused_adam.h"

namespace deepspeed {
namespace offload {
namespace {

optim::AdamStepParams step_params(torch::optim::Optimizer& options, size_t group, int64_t step,
                                  double grad_scale) {
  auto& fused = static_cast<optim::FusedAdam&>(options);
  auto& g = static_cast<torch::optim::AdamWOptions&>(options.param_groups().at(group).options());
  optim::AdamStepParams hp;
  hp.lr = static_cast<float>(g.lr());
  hp.beta1 = static_cast<float>(std::get<0>(g.betas()));
  hp.beta2 = static_cast<float>(std::get<1>(g.betas()));
  hp.eps = static_cast<float>(g.eps());
  hp.weight_decay = static_cast<float>(g.weight_decay());
  hp.adamw_mode = fused.adamw_mode();
  hp.bias_correction = fused.bias_correction();
  hp.step = step;
  hp.grad_scale = static_cast<float>(grad_scale);
  return hp;
}

GroupSource group_source(zero::ParamPartition& params) {
  return [&params](int64_t begin, int64_t n) { return params.read_group(begin, n); };
}

}  // namespace

// Each group's options as they are now (an LR scheduler writes them between steps) on its
// segments; one run of group 0's over the partition without groups.
std::vector<optim::AdamHyperRun> SwappedShard::hyper_runs(int64_t step, double grad_scale) const {
  if (segments_.empty()) return {{0, adam_->numel(), step_params(*options_, 0, step, grad_scale)}};
  std::vector<optim::AdamHyperRun> runs;
  runs.reserve(segments_.size());
  for (const auto& s : segments_)
    runs.push_back(
        {s.begin, s.numel, step_params(*options_, static_cast<size_t>(s.group), step, grad_scale)});
  return runs;
}

SwappedShard::SwappedShard(const zero::ShardOptions& options, zero::ParamPartition& params,
                           const zero::OptimizerFactory& make_optimizer) {
  options_ = make_optimizer({torch::zeros({0})});
  if (!dynamic_cast<optim::FusedAdam*>(options_.get()))
    throw ConfigError("zero_optimization.offload_optimizer.device = \"nvme\" needs the \"Adam\" or "
                      "\"AdamW\" optimizer (the swapped update is the vectorised Adam)");
  SwapOptions o;
  o.dir = options.nvme_path;
  o.sub_group_size = options.sub_group_size;
  o.buffer_count = static_cast<int>(options.buffer_count);
  o.aio.block_size = options.aio.block_size;
  o.aio.queue_depth = static_cast<int>(options.aio.queue_depth);
  o.groups = params.swap_groups(options.sub_group_size);
  // Stages 1-2 on a GPU keep the gradient partition there (one sub-group copied down at a time);
  // stage 3's come from its swapped gradient store in host memory.
  o.device_gradients = !options.compute_device.is_cpu() && !options.gradients_from_host;
  // 16-bit masters (fp16/bf16_master_weights_and_grads) in the model's dtype, with fp32 or bf16
  // moments (bf16_optimizer_states): 10 or 6 bytes an element in the file instead of 12.
  if (!options.low_precision_masters.empty()) {
    if (params.dtype() != at::kBFloat16 && params.dtype() != at::kHalf)
      throw ConfigError("config key '" + options.low_precision_masters +
                        "' needs a 16-bit model (fp16.enabled or bf16.enabled); the parameters "
                        "are " + std::string(c10::toString(params.dtype())));
    o.master_format =
        params.dtype() == at::kHalf ? optim::AdamElem::FP16 : optim::AdamElem::BF16;
    o.moment_format = options.bf16_moments ? optim::AdamElem::BF16 : optim::AdamElem::F32;
  }
  adam_ = std::make_unique<SwappedAdam>(params.numel(), group_source(params), o);
  // A client optimizer's groups: the factory gave the placeholder one group per client group.
  segments_ = options.group_segments;
  TORCH_CHECK(segments_.empty() ||
                  options_->param_groups().size() == static_cast<size_t>(options.group_count),
              "SwappedShard: ", options.group_count, " parameter groups expected, the optimizer "
              "has ", options_->param_groups().size());
}

void SwappedShard::step(const zero::ShardGrads& grads, zero::ParamPartition& params,
                        double grad_scale) {
  if (lost_)
    throw Error("engine.step(): this rank's swapped optimizer state (offload_optimizer.nvme_path, "
                "file '" + adam_->path() + "') is partly stepped: an earlier step failed after "
                "updating part of it (" + lost_reason_ + "); load the last checkpoint with its "
                "optimizer states (load_checkpoint)");
  const auto runs = hyper_runs(steps_ + 1, grad_scale);
  try {
    if (grads.source)
      adam_->step(*grads.source, params, params.dtype(), runs);
    else
      adam_->step(grads.tensor, params, params.dtype(), runs);
  } catch (...) {
    // A retry would apply the updated sub-groups' step twice, a checkpoint would keep half a
    // step (docs/decisions.md, "Failures that must not turn into stale or half-read values").
    if (adam_->groups_updated() > 0) {
      lost_ = true;
      lost_reason_ = "an exception that is not a std::exception";
      try {
        throw;
      } catch (const std::exception& e) {
        lost_reason_ = e.what();
      } catch (...) {
      }
      ++steps_;  // those sub-groups are a step on
    }
    throw;
  }
  ++steps_;
}

std::array<at::Tensor, 3> SwappedShard::state_for_load(bool) {
  loading_ = adam_->read_state();  // fp32 with zero moments before the first step
  return loading_;
}

namespace {

// Sub-group k of the file in the first ring buffer; loading writes it back before the next
// one is read (each window is read whole first: fragments may not cover it, e.g. padding, or
// moments when only masters are loaded).
class SwappedWindows : public zero::StateWindows {
 public:
  SwappedWindows(SwappedAdam& adam, bool load) : adam_(adam), load_(load) {
    ranges_ = adam_.group_ranges();
  }
  std::array<at::Tensor, 3> open(size_t k) override {
    if (static_cast<int64_t>(k) == open_) return views_;
    write_back();
    views_ = adam_.read_group(k);
    open_ = static_cast<int64_t>(k);
    return views_;
  }
  void finish() override { write_back(); }

 private:
  void write_back() {
    if (load_ && open_ >= 0) adam_.write_group(static_cast<size_t>(open_));
    open_ = -1;
    views_ = {};
  }
  SwappedAdam& adam_;
  const bool load_;
  int64_t open_ = -1;
  std::array<at::Tensor, 3> views_;
};

}  // namespace

std::unique_ptr<zero::StateWindows> SwappedShard::windows_for_save() {
  return std::make_unique<SwappedWindows>(*adam_, /*load=*/false);
}

std::unique_ptr<zero::StateWindows> SwappedShard::windows_for_load(bool) {
  loading_ = {};
  return std::make_unique<SwappedWindows>(*adam_, /*load=*/true);
}

void SwappedShard::finish_load(int64_t adam_step, zero::ParamPartition& params) {
  torch::NoGradGuard no_grad;
  auto& [master, exp_avg, exp_avg_sq] = loading_;
  if (master.defined()) adam_->write_state(master, exp_avg, exp_avg_sq);  // state_for_load's
  loading_ = {};
  if (adam_step >= 0) {  // < 0: masters alone were loaded (the moments stay half a step on)
    steps_ = adam_step;
    lost_ = false;
    lost_reason_.clear();
  }
  adam_->write_masters(params, params.dtype());
}

void SwappedShard::refresh_masters(zero::ParamPartition& params) {
  torch::NoGradGuard no_grad;
  adam_->reset_masters(group_source(params));
}

}  // namespace offload
}  // namespace deepspeed
