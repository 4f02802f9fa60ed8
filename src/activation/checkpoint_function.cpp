// deepspeed::checkpointing::checkpoint: DeepSpeed's reentrant activation checkpoint as a libtorch
// custom autograd function. Forward runs the segment under no_grad and keeps only its inputs;
// backward re-runs it with grad enabled, under the random-number state of the first run, and
// back-propagates the incoming gradients through the recomputed graph (a nested backward, which
// also fills the gradients of the parameters the segment uses, firing ZeRO's gradient hooks as a
// plain backward would). The recomputation also re-enters the first run's autocast settings, and
// inputs changed in place since the checkpoint are refused (as PyTorch's saved tensors are). With
// partition_activations and a model-parallel group, each rank keeps 1/N of every replicated input
// between forward and backward, and the group all-gathers them before the recomputation
// (Megatron's / DeepSpeed's partitioned activation checkpoints).
#include <chrono>
#include <string>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <c10/core/GradMode.h>
#include <torch/cuda.h>

#include "activation/autocast_state.h"
#include "activation/checkpointing_options.h"
#include "activation/rng_state.h"
#include "deepspeed/checkpointing.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace checkpointing {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Waits for the GPUs the segment runs on, so a profile time is the segment's and not the queue's.
void synchronize_devices(const std::vector<c10::Device>& devices) {
  for (const auto& d : devices)
    if (d.is_cuda()) torch::cuda::synchronize(d.has_index() ? d.index() : -1);
}

// What a checkpoint holds between forward and backward. Held by the autograd node (as a capsule in
// its context), so it dies with the graph: the counters stay right when a graph is dropped unused.
struct SavedSegment : torch::CustomClassHolder {
  Segment segment;
  std::vector<at::Tensor> inputs;     // detached; host copies with cpu_checkpointing
  std::vector<c10::Device> devices;   // where each input lives in the model
  std::vector<bool> needs_grad;       // whether each input wanted a gradient
  // Each input's version counter as the caller's tensor has it (shared with its views and its
  // detached aliases; not its storage, so copies stay the only bytes held) and its value when the
  // checkpoint was made: a change means the input was modified in place since.
  std::vector<c10::VariableVersion> versions;
  std::vector<uint32_t> versions_at_checkpoint;
  // partition_activations: the group the inputs marked in `partitioned` are split over, and
  // their whole shapes (inputs[i] then holds this rank's slice of the flattened input).
  comm::CommunicatorPtr group;
  std::vector<bool> partitioned;
  std::vector<std::vector<int64_t>> shapes;
  RngState rng;
  AutocastState autocast;
  int64_t bytes = 0;
  bool counted = false;   // on_saved accepted it (it may refuse: number_checkpoints)
  bool released = false;

  void release() {
    if (released) return;
    released = true;
    inputs.clear();
    if (counted) detail::on_released(bytes);
  }
  ~SavedSegment() override { release(); }

  // The input (by index) whose version moved since the checkpoint, or -1. Undefined and inference
  // tensors have no counter and are not checked.
  int64_t changed_input() const {
    for (size_t i = 0; i < versions.size(); ++i)
      if (versions[i].enabled() && versions[i].current_version() != versions_at_checkpoint[i])
        return static_cast<int64_t>(i);
    return -1;
  }
};

// Records each input's version counter, before the segment runs.
void record_versions(SavedSegment& saved, const std::vector<at::Tensor>& inputs) {
  for (const auto& t : inputs) {
    c10::VariableVersion v = t.defined() ? t.unsafeGetTensorImpl()->version_counter()
                                         : c10::VariableVersion(c10::VariableVersion::DISABLED);
    saved.versions_at_checkpoint.push_back(v.enabled() ? v.current_version() : 0);
    saved.versions.push_back(std::move(v));
  }
}

// A segment that modifies an input in place would do it again in its recomputation, on the saved
// input (the same tensor, or a copy taken before the first run): the recomputation would then
// start from twice-modified values. DeepSpeed's (and PyTorch's reentrant) checkpoint save the
// inputs after the first run and recompute silently from them, right only for an idempotent
// change (relu_); this refuses every in-place change of an input, at once, and the same way
// whether the saved input is the tensor or a copy.
void check_segment_left_inputs_alone(const SavedSegment& saved) {
  const int64_t i = saved.changed_input();
  if (i < 0) return;
  throw Error("activation checkpointing: the checkpointed segment modified its input " +
              std::to_string(i) +
              " in place (a checkpointed segment must not modify its inputs in place: its "
              "recomputation in backward would apply the change a second time); modify a "
              "clone of the input instead");
}

// An input changed in place after the checkpoint was made: the recomputation would start from the
// changed values (or, for a saved copy, from values the caller's tensor no longer holds). PyTorch's
// saved tensors fail the same way ("modified by an inplace operation"). Checked on every rank
// before any collective, so a partitioned checkpoint fails on all ranks instead of hanging.
void check_inputs_unchanged(const SavedSegment& saved) {
  const int64_t i = saved.changed_input();
  if (i < 0) return;
  throw Error("activation checkpointing: input " + std::to_string(i) +
              " of a checkpointed segment was modified by an inplace operation after the "
              "checkpoint (its version is " +
              std::to_string(saved.versions[i].current_version()) + ", expected " +
              std::to_string(saved.versions_at_checkpoint[i]) +
              "); the recomputation in backward needs the values the segment first ran on: "
              "modify a clone instead, or change the tensor before the checkpoint");
}

// The saved copy of one input: the tensor itself (detached) or, with cpu_checkpointing, a copy in
// pinned host memory when it lives on a GPU. On the CPU build there is nothing to move.
at::Tensor keep(const at::Tensor& t, bool to_host) {
  if (!t.defined()) return t;
  if (!to_host || t.device().is_cpu()) return t.detach();
  at::Tensor host = at::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(true));
  host.copy_(t, /*non_blocking=*/true);
  return host;
}

// What DeepSpeed partitions (is_activation_to_checkpoint): floating-point tensors with at least
// one element per rank of the group. Integer inputs (token ids) and tiny ones are kept whole.
bool partitionable(const at::Tensor& t, int parts) {
  return t.defined() && t.is_floating_point() && t.numel() >= parts;
}

// Rank r's slice of `t` flattened and zero-padded to a multiple of N: elements
// [r * chunk, (r + 1) * chunk), chunk = ceil(numel / N). A copy, so the whole input is not kept
// alive through a view of it.
at::Tensor partition_of(const at::Tensor& t, const comm::Communicator& group) {
  const int64_t n = group.world_size(), chunk = (t.numel() + n - 1) / n;
  at::Tensor flat = t.detach().reshape({-1});
  if (flat.numel() != chunk * n)
    flat = at::cat({flat, at::zeros({chunk * n - flat.numel()}, flat.options())});
  return flat.narrow(0, group.rank() * chunk, chunk).clone();
}

// The whole input back from every rank's slice: one all-gather over the group. COLLECTIVE.
at::Tensor gather_partitions(const at::Tensor& part, const std::vector<int64_t>& shape,
                             comm::Communicator& group, c10::Device device) {
  at::Tensor mine = part.to(device).contiguous();
  at::Tensor whole = at::empty({mine.numel() * group.world_size()}, mine.options());
  group.all_gather(whole, mine)->wait();
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  return whole.narrow(0, 0, numel).view(shape);
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // `inputs` ends with a zero-size tensor that requires grad: it makes the node part of the graph
  // even when no real input requires grad (the first segment of a model reading token ids), so the
  // parameters inside the segment still get their gradients.
  static variable_list forward(AutogradContext* ctx, const Segment* segment,
                               at::TensorList inputs) {
    const Options opts = options();
    auto saved = c10::make_intrusive<SavedSegment>();
    saved->segment = *segment;
    std::vector<at::Tensor> real(inputs.begin(), inputs.end() - 1);
    for (const auto& t : real) {
      saved->devices.push_back(t.defined() ? t.device() : c10::Device(c10::kCPU));
      saved->needs_grad.push_back(t.defined() && t.requires_grad());
    }
    if (opts.synchronize_checkpoint_boundary) synchronize_devices(saved->devices);
    const auto start = Clock::now();
    saved->rng = RngState::capture(saved->devices);
    saved->autocast = AutocastState::capture();
    record_versions(*saved, real);
    comm::CommunicatorPtr group = model_parallel_group();
    if (opts.partition_activations && group && group->world_size() > 1) saved->group = group;
    for (const auto& t : real) {
      const bool split = saved->group && partitionable(t, saved->group->world_size());
      at::Tensor kept = split ? partition_of(t, *saved->group) : t;
      saved->inputs.push_back(keep(kept, opts.cpu_checkpointing));
      saved->partitioned.push_back(split);
      saved->shapes.push_back(t.defined() ? t.sizes().vec() : std::vector<int64_t>{});
      if (t.defined()) saved->bytes += static_cast<int64_t>(kept.numel() * kept.element_size());
    }
    detail::on_saved(saved->bytes);
    saved->counted = true;
    std::vector<at::Tensor> outputs = (*segment)(real);
    check_segment_left_inputs_alone(*saved);
    if (opts.synchronize_checkpoint_boundary) synchronize_devices(saved->devices);
    if (opts.profile) detail::add_forward_time(seconds_since(start));
    ctx->saved_data["segment"] = c10::IValue::make_capsule(saved);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = c10::static_intrusive_pointer_cast<SavedSegment>(
        ctx->saved_data["segment"].toCapsule());
    if (saved->released)
      throw Error(
          "activation checkpointing: backward ran twice through a checkpointed segment (its saved "
          "inputs are freed after the first recomputation; retain_graph is not supported)");
    check_inputs_unchanged(*saved);
    const Options opts = options();
    if (opts.synchronize_checkpoint_boundary) synchronize_devices(saved->devices);
    const auto start = Clock::now();

    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < saved->inputs.size(); ++i) {
      at::Tensor t = saved->inputs[i];
      if (saved->partitioned[i])
        t = gather_partitions(t, saved->shapes[i], *saved->group, saved->devices[i]);
      if (t.defined()) {
        // From pinned host memory (cpu_checkpointing) the copy up is asynchronous: the recompute
        // queues behind it on the same stream, and the host does not wait for the GPU here.
        t = t.device() == saved->devices[i] ? t.detach()
                                             : t.to(saved->devices[i], /*non_blocking=*/true);
        if (saved->needs_grad[i]) t.requires_grad_(true);
      }
      inputs.push_back(t);
    }
    std::vector<at::Tensor> outputs;
    {
      RngStateScope rng(saved->rng);
      AutocastScope autocast(saved->autocast);
      c10::AutoGradMode grad(true);
      outputs = saved->segment(inputs);
    }
    if (opts.synchronize_checkpoint_boundary) synchronize_devices(saved->devices);
    // The profile's "recompute" is the second forward alone, the cost checkpointing adds.
    detail::add_recompute_time(opts.profile ? seconds_since(start) : 0.0);
    if (outputs.size() != grad_outputs.size())
      throw Error("activation checkpointing: the segment returned " +
                  std::to_string(outputs.size()) + " tensors when recomputed but " +
                  std::to_string(grad_outputs.size()) +
                  " in forward (a segment must be a deterministic function of its inputs)");
    variable_list roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!outputs[i].defined() || !outputs[i].requires_grad() || !grad_outputs[i].defined())
        continue;
      roots.push_back(outputs[i]);
      grads.push_back(grad_outputs[i]);
    }
    if (!roots.empty()) torch::autograd::backward(roots, grads);

    variable_list result;
    result.reserve(inputs.size() + 2);
    result.emplace_back();  // the segment pointer
    for (size_t i = 0; i < inputs.size(); ++i)
      result.push_back(saved->needs_grad[i] ? inputs[i].grad() : at::Tensor());
    result.emplace_back();  // the graph anchor
    saved->release();
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> checkpoint(const Segment& segment, const std::vector<at::Tensor>& inputs) {
  if (!c10::GradMode::is_enabled()) return segment(inputs);
  std::vector<at::Tensor> with_anchor = inputs;
  with_anchor.push_back(at::empty({0}).requires_grad_(true));
  return CheckpointFunction::apply(&segment, at::TensorList(with_anchor));
}

at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& segment,
                      const at::Tensor& input) {
  Segment wrapped = [segment](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{segment(in[0])};
  };
  return checkpoint(wrapped, {input})[0];
}

}  // namespace checkpointing
}  // namespace deepspeed
