// The in-memory shard optimizer, and the one place a shard's home is chosen.
#include "zero/shard_optimizer.h"

#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "device/out_of_memory.h"
#include "device/pinned_memory.h"
#include "offload/swapped_shard.h"
#include "optim/adagrad_state.h"
#include "optim/fused_adam.h"
#include "optim/self_communicating.h"
#include "zero/moment_state.h"
#include "zero/no_optimizer_shard.h"
#include "zero/optimizer_state_bytes.h"
#include "zero/step_during_backward.h"
#include "zero/tensor_facts.h"
#include "zero/view_moments.h"

namespace deepspeed {
namespace zero {
namespace {

// Masters and moments in memory, stepped by a torch::optim::Optimizer over one fp32 tensor: the
// partition itself when it is fp32 and resident (`aliased`), else an fp32 copy. With the home
// "cpu" and a partition on a GPU (ZeRO-Offload) the copy is in host memory (page-locked with
// offload_optimizer.pin_memory), and FusedAdam's steps go through StepDuringBackward: the
// gradients come down in their dtype, the vectorised CPU Adam updates the masters chunk by chunk
// and their 16-bit rounding goes up through a small ring — during backward with overlap_step,
// else at step time. Other optimizers get the plain offloaded step (fp32 gradients down, the
// masters up). With the home "none" and a partition in host memory or a file on a GPU (stage 3's
// offload_param without offload_optimizer) the masters and moments are on the GPU and the step
// runs there, its result written back to the store (`device_master_`). With the home "cpu" and a
// partition in a file (offload_param "nvme" beyond max_in_cpu) the masters are a host copy and
// every step writes their rounding back to the store (`swapped_`). With 16-bit masters
// (fp16/bf16_master_weights_and_grads, `low_precision_`) all of this holds in the partition's
// dtype: the partition itself where it is in memory, else a 16-bit copy, with FusedAdam's moments
// in fp32 or bf16.
class InMemoryShard : public ShardOptimizer {
 public:
  InMemoryShard(ParamPartition& params, const OptimizerFactory& make_optimizer,
                const ShardOptions& options) {
    const OffloadDevice home = options.home;
    pin_ = options.pin_memory;
    at::Tensor resident = params.resident();
    if (resident.defined()) partition_device_ = resident.device();
    host_ = home == OffloadDevice::kCpu && resident.defined() && !resident.is_cpu();
    // 16-bit masters (fp16/bf16_master_weights_and_grads) are in the partition's dtype: where the
    // partition is in memory beside the update they are the partition itself.
    low_precision_ = !options.low_precision_masters.empty();
    if (low_precision_ && params.dtype() == at::kFloat)
      throw ConfigError("config key '" + options.low_precision_masters +
                        "' needs a 16-bit model (fp16.enabled or bf16.enabled); the parameters "
                        "are fp32");
    const at::ScalarType master_dtype = low_precision_ ? params.dtype() : at::kFloat;
    mixed_ = params.dtype() != master_dtype;
    // DeepSpeed's stage 3 puts its fp32 partitions, and so the moments and the step, on the
    // compute device unless the optimizer is offloaded (stage3.py: self.device); offload_param
    // alone moves only the 16-bit partition. On the host they would cost 12Ψ/N host bytes, a
    // download of the gradients and a CPU update at every step.
    device_master_ = home == OffloadDevice::kNone && options.compute_device.is_cuda() &&
                     (!resident.defined() || resident.is_cpu());
    aliased_ = !mixed_ && resident.defined() && !host_ && !device_master_;
    swapped_ = home == OffloadDevice::kCpu && !resident.defined();
    {
      const std::string what = std::string("the ") + c10::toString(master_dtype) +
                               " master weights of this rank's partition";
      AllocatingFor naming(what.c_str(), -1, params.numel(), c10::elementSize(master_dtype));
      if (host_) {
        master_ = host_buffer(resident.numel(), master_dtype);
        master_.copy_(resident);
      } else if (device_master_) {
        master_ = (resident.defined() ? resident : params.read_all())
                      .to(options.compute_device, master_dtype, /*non_blocking=*/false,
                          /*copy=*/true);
      } else {
        master_ = aliased_ ? resident : params.read_all().to(master_dtype);
      }
    }
    optimizer_ = make_optimizer({master_});
    fused_ = dynamic_cast<optim::FusedAdam*>(optimizer_.get());
    if (low_precision_) take_low_precision_masters(options);
    if (!options.group_segments.empty()) give_groups_their_views(options);
    // 1-bit Adam and 0/1 Adam are FusedAdams only for their exact-Adam steps; their compressed
    // and local steps neither apply set_grad_scale nor write the 16-bit copy, so they get the
    // plain path: gradients scaled before the step, the partition written after it.
    if (dynamic_cast<optim::SelfCommunicatingOptimizer*>(optimizer_.get())) fused_ = nullptr;
    // FusedAdam writes the 16-bit rounding of each updated master straight into a partition in
    // host memory, in the same pass: no separate copy-back pass.
    if (fused_ && mixed_ && resident.defined() && !host_ && !device_master_) {
      fused_->set_half_copy(master_, resident);
      half_copy_ = true;
    }
    // The update during backward waits on each range's fence on its own thread. Stages 2 and 3
    // give one whether their host partition is page-locked or not (pageable: the engine's thread
    // passes it once it has put the copy in, zero/host_grad_partition.h). Stage 1's gradients
    // stay on the GPU and would come down on the engine's thread into the landing buffer, which
    // only pin_memory makes asynchronous.
    const bool on_gpu = !options.compute_device.is_cpu();
    // Stage 3 with offload_param "cpu" or "nvme" (a partition in a file: the masters are a host
    // copy, swapped_): the masters are in host memory, so the step reads its gradients there, with
    // or without the update during backward, as DeepSpeed keeps the gradient partition on the
    // CPU whenever the optimizer is offloaded.
    offload_param_on_gpu_ =
        home == OffloadDevice::kCpu && on_gpu && (!resident.defined() || resident.is_cpu());
    // With the partition in a file the ranges update the masters alone (nothing is written to
    // the store during backward: ParamStore is the engine thread's); step() writes them back.
    overlap_ = fused_ && home == OffloadDevice::kCpu && options.overlap_step.value_or(on_gpu) &&
               (pin_ || !on_gpu || options.reduces_into_partition);
    if (fused_ && (host_ || overlap_)) {
      // Several parameter groups: each range is cut at the groups' segments and each part
      // stepped with its group's options (FusedAdam::prepare_step, set_flat above).
      StepDuringBackward::Options o;
      o.pin = pin_;
      o.upload = host_;
      o.update_early = overlap_ && options.overlap_step_allowed;
      host_step_ =
          std::make_unique<StepDuringBackward>(*fused_, master_, options.compute_device, o);
      // With the partition in a file, step() writes the masters back whole: nothing to overlap.
      finish_in_forward_ = options.overlap_forward && o.update_early && !swapped_;
    }
  }

  bool finishes_in_forward() const override { return finish_in_forward_; }
  void settle(int64_t begin, int64_t end) override {
    if (host_step_) host_step_->settle(begin, end);
  }
  void complete_step() override {
    if (host_step_) host_step_->complete();
  }
  bool step_handed_over() const override { return host_step_ && host_step_->handed_over(); }

  bool steps_during_backward() const override { return overlap_; }
  void gradients_final(int64_t begin, const at::Tensor& grads, ParamPartition& params,
                       std::shared_ptr<device::CopyFence> ready) override {
    if (refusing_ranges_) return;  // a failed pass's buckets, finished while it is abandoned
    host_step_->take(begin, grads, step_target(params), std::move(ready));
  }
  void abandon_step() override {
    refusing_ranges_ = true;
    if (host_step_) host_step_->abandon();
  }
  void accept_ranges() override { refusing_ranges_ = false; }
  bool step_lost() const override { return host_step_ && host_step_->lost() > 0; }
  // Whenever FusedAdam's update runs on the host, or the masters are there beside stage 3's
  // partition in host memory or in a file (offload_param "cpu" or "nvme"): the GPU keeps only the
  // buckets (ZeRO-Offload's 2Ψ of parameters). Without pin_memory each
  // bucket comes down through a page-locked copy into the pageable partition
  // (zero/host_grad_partition.h): a copy straight into pageable memory would block backward
  // until the GPU got there, at every bucket.
  bool gradients_in_host_memory() const override {
    return host_step_ != nullptr || offload_param_on_gpu_;
  }
  size_t ranges_stepped_during_backward() const override {
    return overlap_ ? host_step_->ranges_in_last_step() : 0;
  }
  // (A step handed over to the next forward is complete as far as the engine is concerned: its
  // readers settle it.)
  bool update_begun_during_backward() const override {
    return host_step_ && host_step_->started() && host_step_->updates_early() &&
           !host_step_->handed_over();
  }
  // Ranges already updated cannot be dropped: the step is abandoned instead (lost, and said so by
  // the next step() or backward), so the worker stops before the gradients are zeroed under it
  // (a pipeline batch that failed after its boundary backward).
  void discard_step() override {
    if (!host_step_) return;
    if (host_step_->started() && host_step_->updates_early())
      host_step_->abandon();
    else
      host_step_->discard();
  }
  // Said once, by the next backward (its error is the acknowledgement; training may go on from
  // there), and by every step() until then.
  void begin_backward() override {
    complete_step();  // a handed-over step: its gradients are about to be overwritten
    abandon_step();  // an update engine.step() did not complete stops; ranges wait for accept
    if (!host_step_ || !host_step_->lost()) return;
    const std::string message = partly_stepped("the next backward");
    host_step_->forget_lost();
    throw Error(message);
  }

  void step(const ShardGrads& grads, ParamPartition& params, double grad_scale) override {
    TORCH_CHECK(grads.tensor.defined(), "InMemoryShard::step needs the gradients in memory");
    complete_step();  // a step with no backward since the last one
    if (host_step_ && host_step_->lost()) throw Error(partly_stepped("engine.step()"));
    if (host_step_ && host_step_->started()) {
      if (host_step_->updates_early()) {
        TORCH_CHECK(grad_scale == 1.0, "InMemoryShard: the update ran during backward, but the "
                    "step scales the gradients by ", grad_scale,
                    " (overlap_step needs no clipping and no fp16 loss scale)");
      } else {
        fused_->set_grad_scale(static_cast<float>(grad_scale));
      }
      if (finish_in_forward_ && host_step_->updates_early())
        return host_step_->hand_over(grads.tensor.view({-1}), step_target(params), first_read_);
      host_step_->finish(grads.tensor.view({-1}), step_target(params));
      if (swapped_) params.write_all(master_.to(params.dtype()));
      return;
    }
    if (host_ && host_step_) {  // ZeRO-Offload's FusedAdam step, after backward
      fused_->set_grad_scale(static_cast<float>(grad_scale));
      host_step_->take(0, grads.tensor.view({-1}), params.resident());
      return host_step_->finish(grads.tensor.view({-1}), params.resident());
    }
    if (host_) return offloaded_step(grads, params, grad_scale);
    // Gradients on another device than the masters: a safety net (every home above keeps both
    // on one device).
    if (grads.tensor.device() != master_.device())
      return step({grads.tensor.to(master_.device()), nullptr}, params, grad_scale);
    if (!mixed_) {
      // 16-bit gradients of 16-bit masters are scaled inside the kernel, in fp32, not rounded
      // to 16 bits first.
      if (low_precision_)
        fused_->set_grad_scale(static_cast<float>(grad_scale), /*grads_are_scratch=*/true);
      else if (grad_scale != 1.0)
        grads.tensor.mul_(grad_scale);
      step_over(grads.tensor);
      if (aliased_) return;  // the partition was updated in place
      params.write_all(master_);
      return;
    }
    // The optimizer works in fp32. deepspeed.cpp's Adam reads 16-bit gradients as they are
    // (FusedAdam::reads_grads_of: bf16 on the CPU, bf16 and fp16 on a GPU). Elsewhere a transient
    // widened copy of them (4Ψ/N for the length of the update, as DeepSpeed's
    // single_partition_of_fp32_groups gradient).
    // Gradients accumulated in fp32 (data_types.grad_accum_dtype; bf16 stage 0's default) are
    // stepped on themselves, as DeepSpeed's BF16_Optimizer steps its fp32 accumulation buffer:
    // every stage drops its gradients after the step (FlatStage::step, Stage3::step), so the
    // scaling below may land in them, and a copy would cost 4Ψ/N more at the step's peak
    // (memory.h).
    const bool read_as_they_are =
        fused_ && optim::FusedAdam::reads_grads_of(master_, grads.tensor.scalar_type()) &&
        grads.tensor.is_contiguous();
    at::Tensor grad = read_as_they_are ? grads.tensor : grads.tensor.to(torch::kFloat);
    if (fused_)  // grad is this step's own: a copy, or gradients dropped after it
      fused_->set_grad_scale(static_cast<float>(grad_scale), /*grads_are_scratch=*/true);
    else if (grad_scale != 1.0)
      grad.mul_(grad_scale);
    step_over(grad);
    if (!half_copy_) params.write_all(master_.to(params.dtype()));
  }

  std::shared_ptr<torch::optim::Optimizer> optimizer() const override { return optimizer_; }

  // Checkpoints hold fp32 masters and moments whatever their dtype here: 16-bit ones are saved
  // widened (exact) and loaded through fp32 copies that finish_load rounds into them.
  std::array<at::Tensor, 3> state_for_save() override {
    auto state = state_to_save();
    return low_precision_ ? widened(state) : state;
  }
  std::array<at::Tensor, 3> state_for_load(bool create_moments) override {
    auto state = this->state(create_moments);
    if (!low_precision_) return state;
    loading_into_ = state;
    loaded_ = widened(state);
    return loaded_;
  }
  // Checkpoints read and write the state where it is, one window of views: 16-bit masters and
  // moments are widened a piece at a time as the writer appends them (runtime/checkpoint_save.cpp)
  // and rounded into as the reader fills them (checkpoint/tag_reader.cpp), so a save or a load
  // makes no fp32 copy of the whole partition (12 bytes an element with fp32 moments).
  std::unique_ptr<StateWindows> windows_for_save() override {
    return whole_state_windows(state_to_save());
  }
  std::unique_ptr<StateWindows> windows_for_load(bool create_moments) override {
    return whole_state_windows(this->state(create_moments));
  }

  void finish_load(int64_t adam_step, ParamPartition& params) override {
    torch::NoGradGuard no_grad;
    complete_step();
    // The loaded masters, moments and step count replace the partly stepped ones; a load of the
    // weights alone (adam_step < 0) leaves the moments half a step on.
    if (host_step_ && adam_step >= 0) host_step_->forget_lost();
    for (size_t k = 0; k < loaded_.size(); ++k)  // 16-bit masters or moments: rounded into them
      if (loaded_[k].defined() && loading_into_[k].defined()) loading_into_[k].copy_(loaded_[k]);
    loaded_ = loading_into_ = {};
    set_step(adam_step);
    if (!aliased_) params.write_all(master_.to(params.dtype()));
  }

  int64_t adam_step() const override {
    return view_moments_ ? view_moments_->step() : moment_step(*optimizer_, master_);
  }

  // During a load of 16-bit masters (state_for_load) finish_load rounds the widened copies it
  // handed out into the masters: a master refreshed or edited meanwhile (load_from_fp32_weights
  // false, a parameter the checkpoint holds no state for) goes into its copy too, or finish_load
  // would put the value from before the load back.
  void refresh_masters(ParamPartition& params) override {
    torch::NoGradGuard no_grad;
    complete_step();
    if (!aliased_) master_.copy_(params.read_all());
    if (loaded_[0].defined()) loaded_[0].copy_(master_);
  }

  void masters_edited(ParamPartition&, int64_t begin, const at::Tensor& values) override {
    torch::NoGradGuard no_grad;
    complete_step();
    if (!aliased_) master_.narrow(0, begin, values.numel()).copy_(values);
    if (loaded_[0].defined()) loaded_[0].narrow(0, begin, values.numel()).copy_(values);
  }

  int64_t resident_host_bytes() const override {
    return master_.is_cpu() ? resident_bytes() : 0;  // the moments live beside the masters
  }

  int64_t resident_bytes() const override {
    return optimizer_state_bytes(*optimizer_) + (aliased_ ? 0 : storage_bytes(master_)) +
           storage_bytes(grad_host_) + (host_step_ ? host_step_->host_bytes() : 0);
  }

 private:
  // What StepDuringBackward writes: the resident partition (uploaded into on a GPU, or the
  // FusedAdam's half copy / the fp32 masters themselves in host memory), or with the partition
  // in a file the masters alone (its update writes no partition then: Options.upload is false).
  at::Tensor step_target(ParamPartition& params) const {
    return swapped_ ? master_ : params.resident();
  }

  at::Tensor host_buffer(int64_t numel, at::ScalarType dtype) const {
    return device::host_buffer(numel, dtype, pin_, partition_device_);
  }

  std::string partly_stepped(const std::string& who) const {
    const std::string head = "ZeRO-Offload: " + who + " finds this rank's optimizer partition "
                             "partly stepped: ";
    if (!host_step_->updates_early())
      return head + "the CPU Adam's step failed after it had begun updating it; reload the last "
                    "checkpoint (load_checkpoint with its optimizer states)";
    if (host_step_->lost_in_forward())
      return head + "the update of a step whose last ranges ran on into the next forward "
                    "(zero_optimization.offload_optimizer.overlap_forward) failed; reload the "
                    "last checkpoint (load_checkpoint with its optimizer states)";
    return head + "an accumulation boundary's backward updated " +
           std::to_string(host_step_->lost()) +
           " of its ranges during backward (zero_optimization.offload_optimizer.overlap_step), "
           "but no step completed them (that backward or its step failed, or engine.step() was "
           "not called after it); reload the last checkpoint (load_checkpoint with its optimizer "
           "states), or set overlap_step to false if failed backwards are retried";
  }

  // A client's libtorch Adagrad has no state for the master or its views (its constructor made
  // it for the module's parameters; the factory and give_groups_their_views clear it): it gets
  // the state its constructor would have made for them. Nothing for other optimizers.
  // SGD's first step makes its buffers per view: into the partition's moment with them.
  void step_optimizer() {
    optim::add_missing_client_adagrad_state(*optimizer_);
    optimizer_->step();
    if (view_moments_) view_moments_->after_step();
  }

  // ZeRO-Offload with an optimizer other than FusedAdam: the device gradients down into fp32
  // host memory, the optimizer on the host, the masters up into the device partition.
  void offloaded_step(const ShardGrads& grads, ParamPartition& params, double grad_scale) {
    if (!grad_host_.defined()) grad_host_ = host_buffer(master_.numel(), at::kFloat);
    grad_host_.copy_(grads.tensor.view({-1}));  // D2H with the widening to fp32; waits for it
    if (grad_scale != 1.0) grad_host_.mul_(grad_scale);
    step_over(grad_host_);
    params.resident().copy_(master_);
  }

  // A client optimizer with several parameter groups (zero/flat_groups.h): a libtorch optimizer
  // steps the views of the master over each group's segments, each view's gradient the same
  // narrow of the partition's. FusedAdam keeps its state by the master (the checkpoints read it
  // there), so it steps the master segment by segment with each group's options instead
  // (FusedAdam::set_flat), whole or range by range (ZeRO-Offload's StepDuringBackward). Lamb
  // and the 1-bit optimizers are refused by client_optimizer.cpp.
  void give_groups_their_views(const ShardOptions& options) {
    TORCH_CHECK(!dynamic_cast<optim::SelfCommunicatingOptimizer*>(optimizer_.get()),
                "InMemoryShard: parameter groups for a 1-bit optimizer; the client optimizer "
                "checks should have refused it");
    auto& groups = optimizer_->param_groups();
    TORCH_CHECK(static_cast<int>(groups.size()) == options.group_count, "InMemoryShard: ",
                options.group_count, " parameter groups expected, the optimizer has ",
                groups.size());
    if (fused_) {
      std::vector<optim::FusedAdam::Segment> segments;
      for (const auto& s : options.group_segments)
        segments.push_back({s.begin, s.numel, static_cast<size_t>(s.group)});
      fused_->set_flat(master_, std::move(segments));
      return;  // the gradient stays on the master (segments_ empty)
    }
    auto views = group_views(master_, options.group_segments, options.group_count);
    for (size_t g = 0; g < groups.size(); ++g) groups[g].params() = views[g];
    segments_ = options.group_segments;
    optimizer_->state().clear();
    if (keeps_one_moment(moment_family(optimizer_.get()))) {
      std::vector<at::Tensor> all;
      for (const auto& group : views) all.insert(all.end(), group.begin(), group.end());
      view_moments_ = std::make_unique<ViewMoments>(*optimizer_, master_, std::move(all));
    }
  }

  void set_step(int64_t step) {
    if (view_moments_) return view_moments_->set_step(step);
    set_moment_step(*optimizer_, master_, step);
  }

  // One optimizer step with `grad` as the masters' gradient, dropped from them afterwards even
  // when the step throws: the stage frees or zeroes its gradient partition next
  // (zero_optimization.release_gradients), and a reference left on the masters would keep the
  // old one alive beside the next backward's.
  void step_over(const at::Tensor& grad) {
    set_grads(grad);
    struct Dropped {
      InMemoryShard* shard;
      ~Dropped() { shard->set_grads(at::Tensor()); }
    } dropped{this};
    step_optimizer();
  }

  // The gradient of the master (1-D, partition numel) as the optimizer reads it: on the master,
  // or cut into the groups' views. Undefined clears them.
  void set_grads(const at::Tensor& grad) {
    if (segments_.empty()) {
      master_.mutable_grad() = grad;
      return;
    }
    // group_views gave each group its views in partition order: walk the segments the same way.
    const at::Tensor flat = grad.defined() ? grad.view({-1}) : at::Tensor();
    std::vector<size_t> next(optimizer_->param_groups().size(), 0);
    for (const auto& s : segments_) {
      auto& view = optimizer_->param_groups()[s.group].params()[next[s.group]++];
      view.mutable_grad() = flat.defined() ? flat.narrow(0, s.begin, s.numel) : at::Tensor();
    }
  }

  // The masters and moments as the last step left them: a handed-over update completed first.
  std::array<at::Tensor, 3> state(bool create_moments) {
    complete_step();
    if (master_.scalar_type() != at::kFloat && !low_precision_)
      throw CheckpointError("checkpoint: the ZeRO master partition is " +
                            std::string(c10::toString(master_.scalar_type())) + ", expected fp32");
    if (view_moments_) return {master_, view_moments_->moment(create_moments), at::Tensor()};
    auto [exp_avg, exp_avg_sq] = moments_of(*optimizer_, master_, create_moments);
    return {master_, exp_avg, exp_avg_sq};
  }

  // What a save writes: the state, made where none exists yet if the optimizer's initial state
  // is not zeros (saves_made_state: Adagrad's initial_accumulator_value).
  std::array<at::Tensor, 3> state_to_save() {
    return state(/*create_moments=*/saves_made_state(moment_family(optimizer_.get())));
  }

  // 16-bit masters: only FusedAdam updates them (DeepSpeed: its CPU Adam, or with bf16 moments
  // its FusedAdam), the moments in fp32 or bf16.
  void take_low_precision_masters(const ShardOptions& options) {
    if (!fused_ || dynamic_cast<optim::SelfCommunicatingOptimizer*>(optimizer_.get()))
      throw ConfigError("config key '" + options.low_precision_masters +
                        "' needs the config's optimizer \"Adam\" or \"AdamW\" (the CPU Adam "
                        "updates 16-bit masters); this engine's optimizer is another");
    fused_->keep_moments_in(options.bf16_moments ? at::kBFloat16 : at::kFloat);
  }

  // state_for_save / state_for_load's fp32 copies of 16-bit state (checkpoints use the windows
  // above, which copy nothing). In host memory wherever the state is: on a GPU they would be
  // GPU memory that a run chose 16-bit masters to save.
  static std::array<at::Tensor, 3> widened(const std::array<at::Tensor, 3>& state) {
    std::array<at::Tensor, 3> out;
    for (size_t k = 0; k < state.size(); ++k)
      if (state[k].defined())
        out[k] = state[k].to(at::kCPU, at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    return out;
  }

  at::Tensor master_;
  bool low_precision_ = false;  // 16-bit masters (ShardOptions::low_precision_masters)
  // A load into 16-bit masters or moments: the fp32 tensors handed out, and what they go into.
  std::array<at::Tensor, 3> loaded_, loading_into_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<GroupSegment> segments_;  // several parameter groups: the partition cut by group
  std::unique_ptr<ViewMoments> view_moments_;  // a one-moment optimizer over segments_
  optim::FusedAdam* fused_ = nullptr;
  bool mixed_ = false;      // a 16-bit partition with fp32 masters: master_ a separate copy
  bool aliased_ = false;    // master_ is the resident partition itself (fp32, or 16-bit masters)
  bool half_copy_ = false;  // FusedAdam writes the 16-bit partition during its update
  bool host_ = false;       // masters in host memory, the partition on a GPU
  bool device_master_ = false;  // masters on the GPU, the partition in host memory or a file
  bool pin_ = false;        // offload_optimizer.pin_memory: host buffers page-locked
  c10::Device partition_device_ = c10::kCPU;  // where the 16-bit partition lives
  bool overlap_ = false;    // offload_optimizer.overlap_step: ranges taken during backward
  bool finish_in_forward_ = false;  // offload_optimizer.overlap_forward: step() hands over
  bool swapped_ = false;    // home "cpu", the partition in a file: masters_ a host copy
  bool offload_param_on_gpu_ = false;  // offload_param "cpu"/"nvme" on a GPU: all of it on the host
  at::Tensor grad_host_;    // host_ without FusedAdam: fp32 gradients of the step
  std::unique_ptr<StepDuringBackward> host_step_;  // FusedAdam's host update (host_ or overlap_)
  bool refusing_ranges_ = false;  // between abandon_step() and accept_ranges()
};

class WholeStateWindows : public StateWindows {
 public:
  explicit WholeStateWindows(std::array<at::Tensor, 3> state) : state_(std::move(state)) {
    if (state_[0].numel() > 0) ranges_.emplace_back(0, state_[0].numel());
  }
  std::array<at::Tensor, 3> open(size_t k) override {
    TORCH_CHECK(k < ranges_.size(), "StateWindows::open: no window ", k);
    return state_;
  }

 private:
  std::array<at::Tensor, 3> state_;
};

}  // namespace

void* TensorPartition::begin_group(int64_t begin, int64_t numel) {
  if (slice_.is_cpu()) return static_cast<char*>(slice_.data_ptr()) + begin * slice_.element_size();
  if (stage_.numel() < numel) stage_ = at::empty({numel}, slice_.options().device(at::kCPU));
  return stage_.data_ptr();
}

void TensorPartition::end_group(int64_t begin, int64_t numel) {
  if (!slice_.is_cpu()) slice_.narrow(0, begin, numel).copy_(stage_.narrow(0, 0, numel));
}

std::unique_ptr<StateWindows> whole_state_windows(std::array<at::Tensor, 3> state) {
  return std::make_unique<WholeStateWindows>(std::move(state));
}

std::unique_ptr<ShardOptimizer> make_shard_optimizer(const ShardOptions& options,
                                                     ParamPartition& params,
                                                     const OptimizerFactory& make_optimizer) {
  // No optimizer (an engine for evaluation): no masters or moments, wherever they would live.
  if (!make_optimizer) return make_no_optimizer_shard(params);
  switch (options.home) {
    case OffloadDevice::kNvme:
      return std::make_unique<offload::SwappedShard>(options, params, make_optimizer);
    case OffloadDevice::kNone:
    case OffloadDevice::kCpu:
      break;
  }
  return std::make_unique<InMemoryShard>(params, make_optimizer, options);
}

}  // namespace zero
}  // namespace deepspeed
