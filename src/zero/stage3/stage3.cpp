#include "zero/stage3/stage3.h"

#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <unordered_set>
#include <utility>

#include <c10/util/accumulate.h>

#include "comm/process_info.h"
#include "deepspeed/errors.h"
#include "device/out_of_memory.h"
#include "zero/backward_reach.h"
#include "zero/gradient_scaling.h"
#include "zero/stage3/init_shard.h"
#include "zero/stage3/quantized_reduce.h"
#include "zero/stage3/unit_granularity.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {
Stage3::Stage3(torch::nn::Module& model, std::vector<at::Tensor> trainable,
               const StageContext& context, const Stage3Options& options,
               const OptimizerFactory& make_optimizer)
    : ctx_(context), options_(options),
      in_flight_(options.reduction.overlap ? kMaxBucketsInFlight : 0) {
  param_dtype_ = options_.param_dtype;
  comm_dtype_ = dtype_from_config(options_.reduction.comm_dtype, param_dtype_);
  refuse_units_of_an_ended_engine(model);
  const LeafRules leaf_rules{options_.zero.stage3_module_granularity_threshold,
                             options_.zero.leaf_module};
  FetchUnits fetch = choose_fetch_units(model, leaf_rules);
  if (ctx_.rank() == 0)  // one write: ranks sharing a terminal must not interleave mid-line
    std::cerr << describe_fetch_units(fetch, leaf_rules);
  modules_ = fetch.units;
  for (size_t k = 0; k < trainable.size(); ++k) param_index_[trainable[k].unsafeGetTensorImpl()] = k;
  const auto owners = parameter_units(model, modules_);
  layout_ = make_stage3_layout(modules_, trainable, ctx_.world_size(), options_.zero, &owners);
  for (size_t u = 0; u < modules_.size(); ++u)
    layout_.units[u + 1].folded = std::move(fetch.folded[u]);
  params_ = std::make_unique<offload::ParamStore>(layout_, param_dtype_, options_.zero, options_.aio,
                                                  ctx_.device);
  zeropp_ = resolve_zeropp(options_.zero, ctx_.world_size());
  // qgZ in two hops when the launcher says the ranks span nodes (LOCAL_WORLD_SIZE and its kin,
  // comm/process_info.h). A node guess that does not match the real hosts (model parallelism
  // reorders the data-parallel ranks) costs speed, never correctness: any grouping sums the same.
  if (zeropp_.quantized_gradients)
    qgz_hops_ = make_qgz_hops(*ctx_.comm, comm::local_world_size(ctx_.world_size()));
  gatherer_ = std::make_unique<UnitGatherer>(layout_, *params_, ctx_.comm, options_.zero,
                                             ctx_.device, zeropp_,
                                             make_hpz_group(*ctx_.comm, zeropp_.hpz));
  // One unit at a time, so a model built under zero::Init is never whole; the root last, as it
  // may hold persistent parameters of units restored just before.
  for (size_t u = 1; u < layout_.units.size(); ++u) partition_unit(static_cast<int>(u));
  partition_unit(0);
  ShardOptions shard = options_.shard;
  shard.compute_device = ctx_.device;
  shard.reduces_into_partition = true;
  shard.gradients_from_host = options_.shard.home == OffloadDevice::kNvme;  // make_unit_gradients
  if (!shard.group_of.empty())
    shard.group_segments = group_segments(own_fragments(), shard.group_of, params_->numel());
  shard_ = make_shard_optimizer(shard, *params_, make_optimizer);
  // After the zero::Init slices are gone (a model bigger than RAM needs the room).
  grads_ = make_unit_gradients(layout_, dtype_from_config(options_.grad_accum_dtype, param_dtype_),
                               options_.shard, options_.aio, ctx_.device, *shard_, *params_,
                               releases_gradients(options_.reduction, ctx_.device));
  gatherer_->regather_root();
  for (size_t u = 1; u < layout_.units.size(); ++u)
    attach_unit(*layout_.units[u].module, gatherer_.get(), static_cast<int>(u));
  make_buckets();
  std::unordered_map<const void*, std::string> names;
  for (auto& kv : model.named_parameters())
    names.emplace(kv.value().unsafeGetTensorImpl(), kv.key());
  for (const auto& slots : layout_.units)
    for (const auto& p : slots.params) {
      auto it = names.find(p.unsafeGetTensorImpl());
      param_names_.push_back(it != names.end() ? it->second
                                               : "#" + std::to_string(param_names_.size()));
    }
}

Stage3::~Stage3() {
  hooks_.clear();
  for (size_t u = 1; u < layout_.units.size(); ++u) {
    auto& slots = layout_.units[u];
    detail::ZeroUnitAccess::partitioned_by_ended_engine(*slots.module) = true;
    for (auto* folded : slots.folded)
      detail::ZeroUnitAccess::partitioned_by_ended_engine(*folded) = true;
  }
  for (auto* m : modules_) attach_unit(*m, nullptr, -1);
  for (auto& b : buckets_) wait_quietly(b.work);
}

// A unit an earlier stage-3 engine partitioned holds only empty parameters once that engine is
// gone (its slices went with it); partitioning them again would build a model of empty tensors,
// which fails later, far from the cause. Every rank sees the same, so every rank throws.
void Stage3::refuse_units_of_an_ended_engine(torch::nn::Module& model) {
  for (auto* unit : find_units(model)) {
    if (!detail::ZeroUnitAccess::partitioned_by_ended_engine(*unit)) continue;
    for (const auto& p : unit->parameters()) {
      if (p.numel() != 0) continue;
      std::string name = "?";
      for (const auto& kv : model.named_parameters())
        if (kv.value().is_same(p)) name = kv.key();
      throw ConfigError("zero_optimization.stage 3: parameter '" + name +
                        "' is empty: a stage-3 engine that has been destroyed partitioned this "
                        "model, and its slices went with it. Build the model again for a new "
                        "engine (load_checkpoint restores the trained values), or keep the first "
                        "engine");
    }
  }
}

// Copies this rank's slice of unit u into the partition buffer, hooks its parameters' gradients
// (while they still have their full shape: the gradient accumulator records it) and releases them.
void Stage3::partition_unit(int u) {
  const auto& slots = layout_.units[u];
  for (auto* folded : slots.folded) restore_init_shard(*folded, *ctx_.comm, ctx_.device);
  if (slots.module) restore_init_shard(*slots.module, *ctx_.comm, ctx_.device);
  torch::NoGradGuard no_grad;
  const auto& L = slots.layout;
  const int rank = ctx_.rank();
  at::Tensor mine;
  {
    AllocatingFor naming("stage 3's partition of unit", u, L.partition_numel,
                         c10::elementSize(param_dtype_));
    mine = torch::zeros({L.partition_numel}, ctx_.options(param_dtype_));
  }
  for (size_t i = 0; i < slots.params.size(); ++i) {
    at::Tensor p = slots.params[i];
    TORCH_CHECK(p.numel() == c10::multiply_integers(slots.shapes[i]), "stage 3: parameter of unit ", u,
                " is not whole at initialize() (numel ", p.numel(), ")");
    // On a GPU, initialize() leaves the units' parameters in host memory (module_placement.h):
    // each moves here, its unit at a time, so the whole model is never on the device. Before the
    // hook: its gradient accumulator records the device (one made for another device is dropped
    // when the data moves, and the hook with it).
    if (p.device() != ctx_.device) p.set_data(p.to(ctx_.device));
    hooks_.add(p, [this, u, i] { on_grad_ready(u, i); });
    const int64_t o = slots.offsets[i], n = p.numel();
    const int64_t lo = std::max(o, L.begin(rank)), hi = std::min(o + n, L.end(rank));
    if (lo < hi) mine.narrow(0, lo - L.begin(rank), hi - lo).copy_(p.reshape({-1}).narrow(0, lo - o, hi - lo));
    if (u != 0) p.set_data(torch::empty({0}, p.options()));
  }
  params_->write(u, mine);
}

void Stage3::make_buckets() {
  const int64_t size = options_.reduction.bucket_numel;
  bucket_of_.resize(layout_.units.size());
  unit_arrived_.assign(layout_.units.size(), 0);
  unit_finished_.assign(layout_.units.size(), 0);
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    const auto& slots = layout_.units[u];
    for (size_t i = 0; i < slots.params.size(); ++i) {
      const int64_t o = slots.offsets[i];
      const int64_t end = o + c10::multiply_integers(slots.shapes[i]);
      // At most `size` elements (a larger parameter alone), as DeepSpeed flushes before overflow.
      if (i == 0 || end - buckets_.back().begin > size) {
        GradBucket bucket;
        bucket.unit = static_cast<int>(u);
        bucket.begin = bucket.end = o;
        buckets_.push_back(std::move(bucket));
      }
      buckets_.back().end = end;
      bucket_of_[u].push_back(buckets_.size() - 1);
    }
    if (!slots.params.empty()) buckets_.back().end = slots.layout.padded_numel;  // padding too
  }
  unit_buckets_.assign(layout_.units.size(), 0);
  for (auto& b : buckets_) unit_buckets_[b.unit]++;
  warned_.assign(layout_.units.size(), false);
  // The launch order is buckets_ backwards (launch_position): the units last to first, so that a
  // model whose backward runs its units last to first (the usual) holds no bucket; the root unit
  // (buckets_' first) goes last, as its embedding's gradient usually comes last.
  std::vector<size_t> position_of_param;
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    first_param_.push_back(position_of_param.size());
    for (size_t b : bucket_of_[u]) position_of_param.push_back(buckets_.size() - 1 - b);
  }
  order_ = std::make_unique<BucketOrder>(std::move(position_of_param), buckets_.size());
}

void Stage3::allocate(GradBucket& b) {
  AllocatingFor naming("stage 3's gradient bucket of unit", b.unit, b.end - b.begin,
                       c10::elementSize(comm_dtype_));
  b.buffer = torch::zeros({b.end - b.begin}, ctx_.options(comm_dtype_));
  bucket_bytes_ += storage_bytes(b.buffer);
  peak_bucket_bytes_ = std::max(peak_bucket_bytes_, bucket_bytes_);
}

void Stage3::begin_backward(bool boundary) {
  // The update during backward would begin a step that step() (refused inside the scope) could
  // not finish, and that the end of a modifier rank's scope would race with. Every rank has the
  // same scopes open and the same settings: every rank refuses here, before anything started.
  if (boundary && shard_->steps_during_backward() && gatherer_->pinned())
    throw Error(
        "engine.backward() at an accumulation boundary inside a gathered_parameters scope on "
        "rank " + std::to_string(ctx_.rank()) + ": with zero_optimization.offload_optimizer."
        "overlap_step the optimizer step begins during backward, and step() cannot run until the "
        "scope ends; end the scope first");
  shard_->begin_backward();  // stops an earlier boundary's update; refuses the recovery's ranges
  abandon_backward();  // the last backward threw: nothing of it is left for this one
  in_backward_ = true;
  boundary_ = boundary;
  order_->begin();
  std::fill(unit_arrived_.begin(), unit_arrived_.end(), 0);
  std::fill(unit_finished_.begin(), unit_finished_.end(), 0);
  grads_->begin_micro_step(boundary);
  shard_->accept_ranges();
}

// A parameter the graph of `root` cannot reach gets no gradient: its part of the bucket stays
// zeros and it counts as arrived now, so that neither the buckets after it in the launch order
// nor its unit's release wait for the end of backward.
void Stage3::expect_gradients_from(const at::Tensor& root) {
  if (!in_backward_) return;
  const BackwardReach reach(root);
  if (!reach.known()) return;
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    const auto& slots = layout_.units[u];
    for (size_t i = 0; i < slots.params.size(); ++i) {
      if (reach.reaches(slots.params[i])) continue;
      order_->mark_unreachable(first_param_[u] + i,
                               [this](size_t position) { launch_position(position); });
      if (++unit_arrived_[u] == static_cast<int>(slots.params.size()))
        gatherer_->backward_done(static_cast<int>(u));
    }
  }
}

// The parameter's gradient moves into its bucket and is freed at once; the buckets whose turn
// has come in the launch order go.
void Stage3::on_grad_ready(int u, size_t i) {
  // A backward the engine does not run (the user's own autograd call): not reduced, its
  // gradients stay on the parameters (as at stages 0-2).
  if (!in_backward_) return;
  const auto& slots = layout_.units[u];
  const size_t k = first_param_[u] + i;
  at::Tensor p = slots.params[i];
  // Off the parameter before anything can throw: a full-size gradient left there would be added
  // into the next backward's.
  at::Tensor g = std::exchange(p.mutable_grad(), at::Tensor());
  // A second gradient (a parameter in two activation-checkpointed segments) would find its
  // bucket reduced (and be lost) or not yet (and overwrite the first, counting twice toward the
  // bucket and the unit's release): refused as at stages 0-2, before it touches the bucket.
  try {
    order_->refuse_second(k, "keep a shared parameter inside one checkpointed segment");
  } catch (const Error& e) {
    throw Error("stage 3, " + param_names_[k] + " (ZeRO unit " + std::to_string(u) + "): " +
                e.what());
  }
  GradBucket& b = buckets_[bucket_of_[u][i]];
  if (g.defined()) {
    if (!b.buffer.defined()) allocate(b);
    b.buffer.narrow(0, slots.offsets[i] - b.begin, g.numel()).copy_(g.reshape({-1}));
  }
  g = at::Tensor();
  order_->mark_ready(k, [this](size_t position) { launch_position(position); });
  // Every gradient of the unit is computed: its backward is over.
  if (++unit_arrived_[u] == static_cast<int>(slots.params.size())) gatherer_->backward_done(u);
}

void Stage3::launch(size_t index) {
  GradBucket& b = buckets_[index];
  if (!b.buffer.defined()) allocate(b);  // no parameter of this bucket got a gradient
  // fp16: the reduce-scatter takes the mean (qgZ, which only sums: g/W first), so a sum past
  // 65504 never reaches the fp16 `received` (gradient_scaling.h).
  const auto scaling = reduce_scatter_scaling(options_.reduction, ctx_.world_size(), comm_dtype_,
                                              /*avg_supported=*/!zeropp_.quantized_gradients);
  if (scaling.before_reduce != 1.0) b.buffer.mul_(scaling.before_reduce);
  const auto& L = layout_.units[b.unit].layout;
  std::vector<int64_t> splits;
  for (int r = 0; r < ctx_.world_size(); ++r) splits.push_back(L.overlap(r, b.begin, b.end));
  {
    AllocatingFor naming("stage 3's reduced gradient slice of unit", b.unit, splits[ctx_.rank()],
                         b.buffer.element_size());
    b.received = torch::empty({splits[ctx_.rank()]}, b.buffer.options());
  }
  if (!zeropp_.quantized_gradients)
    b.work = ctx_.comm->reduce_scatter_v(b.received, b.buffer, splits, scaling.op);
  else if (qgz_hops_.two_hops())
    b.work = quantized_reduce_scatter_v(*ctx_.comm, qgz_hops_, b.received, b.buffer, splits);
  else
    b.work = quantized_reduce_scatter_v(*ctx_.comm, b.received, b.buffer, splits);
  in_flight_.push(index, [this](size_t i) { finish(i); });
}

void Stage3::finish(size_t index) {
  GradBucket& b = buckets_[index];
  b.work->wait();
  b.work.reset();
  const double after = reduce_scatter_scaling(options_.reduction, ctx_.world_size(), comm_dtype_,
                                              /*avg_supported=*/!zeropp_.quantized_gradients)
                           .after_reduce;
  if (b.received.numel() > 0) {
    const auto& L = layout_.units[b.unit].layout;
    const int rank = ctx_.rank();
    const int64_t first = std::max(b.begin, L.begin(rank)) - L.begin(rank);
    if (after != 1.0) b.received.mul_(after);
    grads_->accumulate(b.unit, first, b.received);
  }
  // The unit's gradients of this micro-step are all in (a swapped slice goes back to its file,
  // an offloaded update may start on it).
  // (Not while recovering from a failed backward: nothing of it goes to the offloaded update.)
  if (++unit_finished_[b.unit] == unit_buckets_[b.unit] && !recovering_)
    grads_->unit_complete(b.unit);
  bucket_bytes_ -= storage_bytes(b.buffer);
  b.buffer = at::Tensor();
  b.received = at::Tensor();
}

void Stage3::end_backward(bool) {
  // Buckets whose hooks did not all fire (a parameter unused by this graph), in order.
  order_->launch_rest([this](size_t position) { launch_position(position); });
  in_flight_.drain([this](size_t i) { finish(i); });
  grads_->end_micro_step();
  warn_units_left_gathered();
  gatherer_->end_backward();
  in_backward_ = false;
}

// A unit is released when all its trainable parameters have their gradient; one that never
// gets one (unused by the loss, on this rank or in this step) kept the unit gathered from its
// pre-backward gather to here, where stage3_max_live_parameters could not evict it, and held the
// buckets after its own in the launch order. A parameter the loss's graph cannot reach is counted
// when the backward begins (expect_gradients_from); this is what the graph could not tell (an
// activation-checkpointed segment in it). (DeepSpeed releases at the module's post-backward hook.)
void Stage3::warn_units_left_gathered() {
  for (size_t u = 1; u < layout_.units.size(); ++u) {
    const auto& slots = layout_.units[u];
    if (warned_[u] || slots.params.empty() || !gatherer_->backward_pending(static_cast<int>(u)) ||
        unit_arrived_[u] == static_cast<int>(slots.params.size()))
      continue;
    warned_[u] = true;
    std::string missing;
    for (size_t i = 0; i < slots.params.size(); ++i)
      if (!order_->marked(first_param_[u] + i))
        missing += (missing.empty() ? "" : ", ") + param_names_[first_param_[u] + i];
    // One write: ranks in one process (or sharing a terminal) must not interleave mid-line.
    const std::string line =
        "[deepspeed] warning: rank " + std::to_string(ctx_.rank()) + ", stage 3: " + missing +
        " (ZeRO unit " + std::to_string(u) +
        ") got no gradient in a backward, so the unit stayed gathered until the end of "
        "that backward (stage3_max_live_parameters does not evict it: the bound can be "
        "exceeded) and the gradient buckets of the units before it were held until "
        "then (the loss's autograd graph could not tell when backward began: an activation "
        "checkpoint, or a custom autograd function, in it). Set requires_grad to false on a "
        "parameter the loss never uses (frozen "
        "parameters are not partitioned), or move it out of the unit. Warned once per "
        "unit.\n";
    std::fputs(line.c_str(), stderr);
  }
}

// ZeroStage::abandon_backward: what the next begin_backward would do, now.
void Stage3::abandon_backward() {
  if (!in_backward_) return;
  shard_->abandon_step();  // before the recovery, which touches what the update reads
  recover_abandoned();
  in_backward_ = false;  // (if the recovery threw, the next begin_backward tries again)
}

// The last backward threw midway. Its launched buckets are finished (every rank launched them in
// the same order; their sums reach the gradients, whose own recovery keeps them, as a device
// buffer keeps what a failed backward wrote); the buckets it filled but did not launch are
// dropped (launching one now would need every rank's part); the units it gathered go back.
void Stage3::recover_abandoned() {
  recovering_ = true;
  in_flight_.drain([this](size_t i) { finish(i); });
  recovering_ = false;
  for (auto& b : buckets_)
    if (b.buffer.defined()) {
      bucket_bytes_ -= storage_bytes(b.buffer);
      b.buffer = b.received = at::Tensor();
    }
  gatherer_->end_backward();
}

// One all-reduce of the partitions' summed squares: also the fp16 overflow vote.
at::Tensor Stage3::global_grad_norm_tensor() {
  at::Tensor sq = grads_->squared_norm();
  ctx_.comm->all_reduce(sq)->wait();
  return sq.sqrt_();
}

double Stage3::global_grad_norm() { return global_grad_norm_tensor().item<double>(); }

void Stage3::step(double grad_scale) {
  gatherer_->before_store_changes();
  shard_->step(grads_->for_step(), *params_, grad_scale);
  gatherer_->regather_root();
  discard_gradients();
}

void Stage3::discard_gradients() {
  shard_->discard_step();
  grads_->clear();
}

MemoryReport Stage3::memory() const {
  MemoryReport r;
  r.parameters = params_->resident_bytes();
  r.gradients = grads_->bytes();
  r.optimizer_states = shard_->resident_bytes();  // a swapped shard: its buffers, the rest is on disk
  r.host_comm_buffers = grads_->host_temporary_bytes();
  r.comm_buffers =  // the buckets, and what the partition's transfers held beside them
      peak_bucket_bytes_ + grads_->device_temporary_bytes() + r.host_comm_buffers;
  auto g = gatherer_->stats();
  r.gathered_numel = g.numel;
  r.peak_gathered_numel = g.peak_numel;
  r.gathered_bytes = g.bytes;
  r.peak_gathered_bytes = g.peak_bytes;
  // Swapped or offloaded gradients and the parameter partition of offload_param live in host
  // memory.
  r.host_bytes = host_share(ctx_.device, r.comm_buffers + r.gathered_bytes) +
                 (ctx_.device.is_cpu() ? 0 : r.host_comm_buffers) +
                 (grads_->in_host_memory() ? r.gradients : host_share(ctx_.device, r.gradients)) +
                 params_->host_bytes() + shard_->resident_host_bytes();
  r.nvme_bytes = params_->file_bytes() + grads_->file_bytes() + shard_->file_bytes();
  return r;
}

std::function<void()> Stage3::gather_for_access(
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
    std::optional<int> modifier_rank) {
  std::unordered_set<const void*> wanted;
  for (auto& m : modules)
    for (auto& p : m->parameters()) wanted.insert(p.unsafeGetTensorImpl());
  std::vector<int> units;
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    bool take = modules.empty();
    for (auto& p : layout_.units[u].params) take = take || wanted.count(p.unsafeGetTensorImpl());
    if (take && !layout_.units[u].params.empty()) units.push_back(static_cast<int>(u));
  }
  // A pin that throws (an out-of-memory, likeliest when gathering the whole model) unpins those
  // before it: a unit left pinned would never be released, nor regathered after a step.
  for (size_t k = 0; k < units.size(); ++k) {
    try {
      gatherer_->pin(units[k]);
    } catch (...) {
      for (size_t j = 0; j < k; ++j) gatherer_->unpin(units[j]);
      throw;
    }
  }
  // With a modifier rank, this rank's slice as gathered (the partition's values: the pin gathers
  // exactly), taken now: the parameters are views of the gathered buffer, so by the release it
  // holds the scope's edits, and on the modifier rank the broadcast would not change it.
  std::vector<at::Tensor> before;
  if (modifier_rank) {
    torch::NoGradGuard no_grad;
    for (int u : units) before.push_back(own_slice(u).clone());
  }
  return [this, units, modifier_rank, before = std::move(before)] {
    release_units(units, modifier_rank, before);
  };
}

at::Tensor Stage3::own_slice(int unit) {
  const auto& L = layout_.units[unit].layout;
  return gatherer_->full(unit).narrow(0, L.begin(ctx_.rank()), L.partition_numel);
}

void Stage3::release_units(const std::vector<int>& units, std::optional<int> modifier_rank,
                           const std::vector<at::Tensor>& before) {
  torch::NoGradGuard no_grad;
  size_t k = 0;
  try {
    for (; k < units.size(); ++k) {
      const int u = units[k];
      if (modifier_rank) {  // the edits become the masters
        at::Tensor full = gatherer_->full(u);
        ctx_.comm->broadcast(full, *modifier_rank)->wait();
        at::Tensor mine = own_slice(u);
        params_->write(u, mine);
        write_edited_masters(layout_.units[u].partition_offset, before[k], mine);
      }
      gatherer_->unpin(u);
    }
  } catch (...) {
    // The scope has ended (its release runs once): the units not unpinned yet are unpinned
    // without their edits, so that none stays pinned, and so whole, for ever.
    for (; k < units.size(); ++k) {
      try {
        gatherer_->unpin(units[k]);
      } catch (...) {
      }
    }
    throw;
  }
}

// Only the elements the modifier rank changed reach the fp32 masters, one run of consecutive
// changed elements at a time: with 16-bit parameters the whole slice would round every master
// to 16 bits even where nothing was edited (DeepSpeed leaves an unedited partition alone). An
// element this rank edited in its own copy (dropped: it is not the modifier) counts as changed
// and gets the partition's 16-bit value. A swapped optimizer reads and writes whole sub-groups
// per write, and a checkpoint's module load changes nearly everything in runs broken wherever a
// 16-bit value happens to stay: there, and past kMaxEditedRuns runs, one write spans the first
// to the last changed element (the unchanged ones inside it take their 16-bit values).
void Stage3::write_edited_masters(int64_t offset, const at::Tensor& before,
                                  const at::Tensor& after) {
  constexpr int64_t kMaxEditedRuns = 16;
  const at::Tensor changed = before.ne(after);
  if (!changed.any().item<bool>()) return;
  // Edges of the runs: +1 where one starts, -1 one past where it ends.
  const at::Tensor none = torch::zeros({1}, changed.options().dtype(at::kChar));
  const at::Tensor edges = torch::diff(torch::cat({none, changed.to(at::kChar), none}));
  const at::Tensor starts = (edges == 1).nonzero().flatten().cpu();
  const at::Tensor ends = (edges == -1).nonzero().flatten().cpu();
  const auto* s = starts.data_ptr<int64_t>();
  const auto* e = ends.data_ptr<int64_t>();
  const int64_t runs = starts.numel();
  if (runs > kMaxEditedRuns || options_.shard.home == OffloadDevice::kNvme) {
    shard_->masters_edited(*params_, offset + s[0], after.narrow(0, s[0], e[runs - 1] - s[0]));
    return;
  }
  for (int64_t r = 0; r < runs; ++r)
    shard_->masters_edited(*params_, offset + s[r], after.narrow(0, s[r], e[r] - s[r]));
}

}  // namespace zero
}  // namespace deepspeed
