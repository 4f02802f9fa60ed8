// The ZeRO stage strategy: everything that differs between stages 0-3 lives behind this interface,
// chosen once when the engine is built, so the engine's step reads as one recipe with no
// test of the stage number in it.
//
// Vocabulary (used the same way everywhere): a *bucket* is a run of gradients reduced by one
// collective; a *partition* is the slice of a flat buffer that one rank owns.
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/memory.h"

namespace deepspeed {
namespace zero {

// A piece of one trainable parameter's fp32 training state held by this rank, for checkpoints
// (checkpoint/layout.h): elements [offset, offset + numel) of the flattened parameter.
struct StateFragment {
  size_t param = 0;     // index into the parameters the stage was built with
  int64_t offset = 0;
  int64_t numel = 0;
  int64_t at = 0;       // where its element 0 lies in the shard optimizer's partition, if any
  at::Tensor master;    // 1-D fp32 views of numel elements into the live state: reading them saves,
  at::Tensor exp_avg;   // writing them loads. Moments are undefined when the optimizer is not
  at::Tensor exp_avg_sq;  // FusedAdam or has no state for the parameter yet. (Unset in the
                          // fragments() of a FragmentState: ask it for pieces.)
};

// This rank's checkpoint state as fragments, read (to save) or written (to load) piece by piece.
// A piece lies inside one window of the shard optimizer's state (a swapped shard: one sub-group,
// read from its file into a buffer it already has), so a state larger than memory is saved and
// loaded with one window in memory at a time. Pieces may be visited in any order; visiting them
// in fragment order touches each window once (three times for a fragment spanning windows when
// its master and both moments are written one after the other). Not thread-safe.
class FragmentState {
 public:
  virtual ~FragmentState() = default;
  // The fragments (param, offset, numel, at; no views), in flat order.
  const std::vector<StateFragment>& fragments() const { return fragments_; }
  // Fragment i cut into pieces: (offset within the fragment, numel), in order.
  virtual std::vector<std::pair<int64_t, int64_t>> pieces(size_t i) const = 0;
  // [master, exp_avg, exp_avg_sq] of elements [offset, offset + numel) of fragment i, which must
  // lie inside one piece: 1-D fp32 views, moments undefined when the optimizer keeps none. Valid
  // until the next call or finish().
  virtual std::array<at::Tensor, 3> piece(size_t i, int64_t offset, int64_t numel) = 0;
  // Loading: every piece written has reached the optimizer's state. Call once, at the end.
  virtual void finish() {}

 protected:
  std::vector<StateFragment> fragments_;
};

class ZeroStage {
 public:
  virtual ~ZeroStage() = default;
  // Around loss.backward(). `boundary`: this micro-step ends a gradient accumulation, so the
  // gradients must be reduced across ranks before step(). COLLECTIVE when boundary.
  virtual void begin_backward(bool boundary) = 0;
  // Between begin_backward and the backward: it differentiates `root`, so a parameter its graph
  // cannot reach gets no gradient in it, and the buckets need not wait for that parameter
  // (zero/backward_reach.h). May launch reductions (COLLECTIVE as the backward's are). Without
  // this call the buckets wait for every parameter to the end of backward (a pipeline's backward).
  virtual void expect_gradients_from(const at::Tensor& /*root*/) {}
  virtual void end_backward(bool boundary) = 0;
  // The backward since begin_backward threw (a hook, an out-of-memory): finish the reductions it
  // launched (every rank launched them; their sums stay in the gradients, as PyTorch's .grad
  // keeps what a failed backward computed) and give back what it holds (buckets, gathered
  // units) now, so a retry, with a smaller micro-batch say, has that memory. The next
  // begin_backward also detects a failed backward, for callers that drive a stage directly.
  // Local, but waits for collectives already launched.
  virtual void abandon_backward() {}
  // Ranges of the partition the last step updated during backward (offload_optimizer
  // .overlap_step); 0 where the update runs at the step. Local.
  virtual size_t ranges_stepped_during_backward() const { return 0; }
  // Whether the boundary backward hands reduced gradient ranges to the optimizer as they are
  // final (offload_optimizer.overlap_step): anything that changes gradients after the reduction
  // (a pipeline's tied-gradient sum) would come too late for them. Local.
  virtual bool steps_during_backward() const { return false; }
  // Whether the last boundary's backward has already updated ranges of the optimizer partition
  // (and their parameters) that no step() has completed yet: until step(), reading or writing
  // the masters, the moments or the parameters would see half of a step. Local.
  virtual bool update_begun_during_backward() const { return false; }
  // Whether a gathered_parameters scope is open (stage 3's units pinned whole): a step now would
  // leave the scope's copies stale, and its end would write them back over the step. Local
  // (every rank opens and ends the scopes alike).
  virtual bool gathered_scope_open() const { return false; }
  // A step the update during backward had begun was never completed (its backward or its step
  // failed): the optimizer state is partly stepped until a checkpoint is loaded. step() and the
  // next backward say so. Local.
  virtual bool step_lost() const { return false; }
  // L2 norm of the averaged gradients over the whole model, identical on every rank. COLLECTIVE.
  virtual double global_grad_norm() = 0;
  // The same norm as a one-element fp64 tensor, on the stage's device and not yet waited for: the
  // engine reads its value only when the step needs it (clipping, fp16's overflow vote), so a
  // GPU step otherwise has no host wait. By default global_grad_norm()'s value, read now.
  // COLLECTIVE.
  virtual at::Tensor global_grad_norm_tensor();
  // Scales gradients by grad_scale (clipping), runs the optimizer, leaves every rank with the
  // updated parameters, and clears gradients. COLLECTIVE.
  virtual void step(double grad_scale) = 0;
  // Drops the gradients of this step without updating (an fp16 overflow). Local.
  virtual void discard_gradients() = 0;
  virtual MemoryReport memory() const = 0;
  virtual std::shared_ptr<torch::optim::Optimizer> optimizer() const = 0;

  // ---- checkpoints (zero/*_checkpoint.cpp) ----
  // The fragments this rank writes: its ZeRO partition (stage 0: the same 1/N share of its
  // replicated state). Fragments are in flat order, as checkpoint::partition_fragments gives them.
  // Reads nothing until pieces are asked for. Local.
  virtual std::unique_ptr<FragmentState> state_to_save() = 0;
  // The fragments this rank must fill to load a checkpoint (stage 0: every parameter whole).
  // With create_moments, moment state (Adam's, Lion's) that does not exist yet is created
  // (zeros) first.
  virtual std::unique_ptr<FragmentState> state_to_load(bool create_moments) = 0;
  // The step count of an optimizer whose state checkpoints save per element (the Adam family,
  // Lion: zero/moment_state.h; identical for every parameter), 0 before the first step; -1 for
  // any other optimizer. The manifest's "adam_step" whichever of them saved it.
  virtual int64_t adam_step() const = 0;
  // After a state_to_load() was written and finished: sets the Adam step (when >= 0) and makes
  // the model parameters equal to the masters on every rank. COLLECTIVE.
  virtual void finish_load(int64_t adam_step) = 0;
  // After the module's weights were overwritten (load_module_only): masters taken from them.
  virtual void refresh_masters_from_model() = 0;
  // Which fragments rank `rank` saves (param, offset, numel only), for the manifest. Default: the
  // canonical 1/N share of the parameters in flat order (stages 0-2); stage 3 saves its per-unit
  // slices. `numels`: the trainable parameters' element counts, in registration order.
  virtual std::vector<StateFragment> fragments_of_rank(int rank, const std::vector<int64_t>& numels,
                                                       int world_size) const;
  // Every rank holds the same whole optimizer state (stage 0), so any rank's saved state fits.
  virtual bool replicated_state() const { return false; }
  // The module file is written and read one gather group at a time, so a stage-3 model is never
  // whole on any rank: gather_group_of(p) is the group that makes parameter p whole (stage 3: its
  // unit), or -1 when p always is (stages 0-2, frozen parameters). whole_shape(p) is p's shape
  // when whole. gather_group(g, modifier_rank) makes group g whole until the returned function
  // runs, which re-partitions it keeping modifier_rank's values (none: edits are dropped); both
  // COLLECTIVE.
  virtual int gather_group_of(const at::Tensor& /*param*/) const { return -1; }
  virtual std::vector<int64_t> whole_shape(const at::Tensor& param) const {
    return param.sizes().vec();
  }
  virtual std::function<void()> gather_group(int /*group*/, std::optional<int> /*modifier_rank*/) {
    return [] {};
  }
  // Tensor parallelism (tp/tp_stage.h counts a split parameter once per tensor-parallel rank
  // and a replicated one once): {sum of squares of the reduced gradients of the parameters in
  // `selected` (by identity), the same over all other parameters}, each summed over the
  // data-parallel group, identical on every rank: fp64 [2] on the stage's device, not waited for
  // (as global_grad_norm_tensor). One reduction. COLLECTIVE. The default throws ConfigError (a
  // stage whose gradients cannot be told apart by parameter).
  virtual at::Tensor grad_square_sums(const std::vector<at::Tensor>& selected);
  // A norm computed from grad_square_sums as every data-parallel rank must see it. Where the
  // ranks' gradients stay local (a 1-bit optimizer past its warm-up: FlatStage) each rank's norm
  // is its own, and a non-finite one on any rank must become non-finite on all (fp16's overflow
  // vote: they skip the step together, else they step different optimizers and their next
  // collectives part): COLLECTIVE over the data-parallel group then. Elsewhere the reduced
  // gradients already agree: `norm` as given. fp64 [1] on the stage's device, not waited for.
  virtual at::Tensor agreed_across_data_ranks(at::Tensor norm) { return norm; }
  // Engine::forward is about to run the model (stage 3 restarts its trace; with
  // offload_optimizer.overlap_forward the parameters outside every unit are waited for). Local.
  virtual void before_forward() {}
  // offload_optimizer.overlap_forward: step() may leave the update's last ranges running into
  // the next forward (zero/forward_waits.h); this waits for them, after which the parameters
  // and the optimizer state are the step's. Local. A failed update throws (step_lost()).
  virtual void complete_step() {}
  // Whether the last step() left its update running into the next forward and nothing has
  // completed it yet (tests, logs). Local.
  virtual bool step_handed_over() const { return false; }
  // Makes the full parameters of `modules` (all when empty) present and writable until the
  // returned function runs; that function re-partitions them, keeping modifier_rank's values
  // (none: edits are dropped). Both COLLECTIVE. Stages 0-2 always hold the full parameters.
  virtual std::function<void()> gather_for_access(
      const std::vector<std::shared_ptr<torch::nn::Module>>& /*modules*/,
      std::optional<int> /*modifier_rank*/) {
    return [] {};
  }
};

}  // namespace zero
}  // namespace deepspeed
