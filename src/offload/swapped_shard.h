// The shard optimizer at home "nvme" (ZeRO-Infinity's optimizer offload, any ZeRO stage 1-3):
// the rank's masters and Adam moments (fp32; or low-precision: a 16-bit master with fp32 or bf16
// moments) live in a SwappedAdam file under nvme_path; the
// optimizer object the engine and the LR scheduler see is a FusedAdam over a 0-element
// placeholder that only carries lr/betas/eps/weight decay: one group, or one per parameter group
// of a client optimizer, whose segments of the partition (zero/flat_groups.h) each step with
// their group's options (a sub-group crossing a segment boundary is split). Only Adam/AdamW can
// be swapped (the swapped update is the vectorised Adam).
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>

#include "offload/swapped_adam.h"
#include "zero/shard_optimizer.h"

namespace deepspeed {
namespace offload {

class SwappedShard : public zero::ShardOptimizer {
 public:
  // Writes the partition's initial masters to the file one sub-group at a time. Throws
  // ConfigError for optimizers other than Adam/AdamW, IOError for a bad nvme_path.
  SwappedShard(const zero::ShardOptions& options, zero::ParamPartition& params,
               const zero::OptimizerFactory& make_optimizer);

  // A step that throws (a short read or write, the gradient store's refusal, an out-of-memory)
  // after it had updated a sub-group leaves the state partly stepped, some sub-groups on the new
  // values and the rest on the old: step_lost() says so, and this step(), every step() after it
  // and save_checkpoint throw until finish_load (a checkpoint's optimizer states) replaces the
  // state. One that throws before updating any sub-group leaves everything, the step count
  // too, as it was: a retry is clean.
  void step(const zero::ShardGrads& grads, zero::ParamPartition& params, double grad_scale) override;
  bool step_lost() const override { return lost_; }
  std::shared_ptr<torch::optim::Optimizer> optimizer() const override { return options_; }
  // The whole state in memory (tests); checkpoints use the windows.
  std::array<at::Tensor, 3> state_for_save() override { return adam_->read_state(); }
  std::array<at::Tensor, 3> state_for_load(bool create_moments) override;
  // One sub-group at a time, read from the file into the first ring buffer (and, loading,
  // written back): a checkpoint never holds more of the state in memory than a step does.
  std::unique_ptr<zero::StateWindows> windows_for_save() override;
  std::unique_ptr<zero::StateWindows> windows_for_load(bool create_moments) override;
  // The parameters receive the masters sub-group by sub-group.
  void finish_load(int64_t adam_step, zero::ParamPartition& params) override;
  int64_t adam_step() const override { return steps_; }
  void refresh_masters(zero::ParamPartition& params) override;
  // Rewrites the sub-groups holding the edited range only; the other masters keep their fp32
  // values (as in memory).
  void masters_edited(zero::ParamPartition&, int64_t begin, const at::Tensor& values) override {
    adam_->set_masters(begin, values);
  }
  int64_t resident_bytes() const override { return adam_->resident_bytes(); }
  int64_t file_bytes() const override { return adam_->file_bytes(); }

  SwappedAdam& adam() { return *adam_; }

 private:
  // The step's constants by run of the partition, from the groups' options now.
  std::vector<optim::AdamHyperRun> hyper_runs(int64_t step, double grad_scale) const;

  std::shared_ptr<torch::optim::Optimizer> options_;  // param-group options, no state
  std::vector<zero::GroupSegment> segments_;  // several groups: the partition cut by group
  std::unique_ptr<SwappedAdam> adam_;
  int64_t steps_ = 0;  // Adam's step count (bias correction); checkpoints save it
  bool lost_ = false;  // the state is partly stepped (a step failed midway)
  std::string lost_reason_;  // that step's error
  // While a checkpoint loads: the state the fragments write into, written back by finish_load.
  std::array<at::Tensor, 3> loading_;
};

}  // namespace offload
}  // namespace deepspeed
