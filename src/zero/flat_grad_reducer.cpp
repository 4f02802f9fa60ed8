#include "zero/flat_grad_reducer.h"

#include <torch/torch.h>

#include <algorithm>

#include "device/out_of_memory.h"
#include "zero/backward_reach.h"
#include "zero/gradient_scaling.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {

// ---- the shared machinery ------------------------------------------------------------------

FlatGradReducer::FlatGradReducer(const StageContext& context, FlatParams& flat, int owner,
                                 const ReductionOptions& options, at::ScalarType comm_dtype,
                                 size_t max_in_flight, bool hooked, bool launch_from_hooks)
    : ctx_(context), flat_(flat), owner_(owner), options_(options), comm_dtype_(comm_dtype),
      in_flight_(max_in_flight), launch_from_hooks_(launch_from_hooks) {
  for (auto& range : make_bucket_ranges(flat_, options_.bucket_numel)) {
    Bucket bucket;
    bucket.range = range;
    buckets_.push_back(std::move(bucket));
  }
  std::vector<size_t> bucket_of_slot(flat_.slots().size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t s : buckets_[b].range.slots) bucket_of_slot[s] = b;
  order_ = std::make_unique<BucketOrder>(std::move(bucket_of_slot), buckets_.size());
  if (hooked)
    for (size_t s = 0; s < flat_.slots().size(); ++s)
      hooks_.add(flat_.slots()[s].param, [this, s] {
        if (!catching_) return;
        // A second gradient (refused) touches no bucket, which may be on the wire, and leaves the
        // parameter, where it would be added into the next backward's (as at stage 3).
        if (reducing_ && launch_from_hooks_ && order_->marked(s)) {
          flat_.slots()[s].param.mutable_grad() = at::Tensor();
          order_->refuse_second(s);
        }
        arrived(s);
        if (reducing_ && launch_from_hooks_)
          order_->mark_ready(s, [this](size_t b) { launch_index(b); });
      });
}

FlatGradReducer::~FlatGradReducer() {
  hooks_.clear();
  for (auto& b : buckets_) wait_quietly(b.work);
}

void FlatGradReducer::start(bool reducing, bool boundary) {
  catching_ = true;
  reducing_ = reducing;
  boundary_ = boundary;
  order_->begin();
}

// A parameter that gets no gradient contributes what earlier backwards that did not reduce left
// (the all-reduce buffer holds what earlier micro-steps accumulated; the scatterer takes a .grad
// left on the parameter, as a pipeline stage's earlier micro-batches leave it) or zeros, whether
// its bucket goes now or at end_backward: the same collectives, in the same order, on the same
// data.
void FlatGradReducer::expect_gradients_from(const at::Tensor& root) {
  if (!catching_ || !reducing_ || !launch_from_hooks_ || hooks_.empty()) return;
  const BackwardReach reach(root);
  if (!reach.known()) return;
  for (size_t s = 0; s < flat_.slots().size(); ++s)
    if (!reach.reaches(flat_.slots()[s].param))
      order_->mark_unreachable(s, [this](size_t b) { launch_index(b); });
}

// Whatever threw: the backward, end_backward midway (an out-of-memory in a bucket's conversion,
// a collective's wait), or an earlier recovery. After a pass that completed there is nothing in
// flight and nothing lent, so both steps do nothing.
void FlatGradReducer::abandon_backward() {
  catching_ = false;
  reducing_ = false;
  boundary_ = false;  // nothing of the failed pass goes to the offloaded update
  in_flight_.drain([this](size_t i) { finish(buckets_[i]); });
  drop_unlaunched();
}

void FlatGradReducer::drop_accumulated_grads() {
  if (every_micro_step_) return;
  for (const auto& slot : flat_.slots()) slot.param.mutable_grad() = at::Tensor();
}

void FlatGradReducer::announce_final(int64_t begin, int64_t end,
                                     std::shared_ptr<device::CopyFence> ready) {
  if (!boundary_ || !on_final_) return;
  const auto& layout = flat_.layout();
  const int64_t mine = layout.begin(owner_);
  const int64_t lo = std::max(begin, mine);
  const int64_t hi = std::min(end, mine + layout.partition_numel);
  if (lo < hi) on_final_(lo - mine, hi - lo, std::move(ready));
}

void FlatGradReducer::launch_index(size_t b) {
  launch(buckets_[b]);
  in_flight_.push(b, [this](size_t i) { finish(buckets_[i]); });
}

void FlatGradReducer::end_backward() {
  catching_ = false;
  if (!reducing_) return;
  // Buckets not launched yet: no hooks (no overlap), or a parameter unused by this graph whose
  // hook never fired (its gradient is zeros).
  order_->launch_rest([this](size_t b) { launch_index(b); });
  in_flight_.drain([this](size_t i) { finish(buckets_[i]); });
  reducing_ = false;
  partition_->end_micro_step();
}

// ---- all-reduce at the boundary (stages 0, 1) ------------------------------------------------

AllReduceBuckets::AllReduceBuckets(const StageContext& context, FlatParams& flat, int owner,
                                   const ReductionOptions& options, at::ScalarType comm_dtype,
                                   at::ScalarType grad_dtype)
    : FlatGradReducer(context, flat, owner, options, comm_dtype,
                      options.finish_buckets_early || comm_dtype != grad_dtype
                          ? kMaxBucketsInFlight  // each in flight holds its wire copy
                          : kUnboundedInFlight,
                      /*hooked=*/options.overlap || grad_dtype != flat.buffer().scalar_type(),
                      /*launch_from_hooks=*/options.overlap),
      wider_(grad_dtype != flat.buffer().scalar_type()) {
  const auto& layout = flat_.layout();
  // Stage 1, and stage 0 in 16 bits: the report names the stage beside it.
  AllocatingFor naming("the flat gradients of every parameter (all-reduced at the boundary)", -1,
                       layout.padded_numel, c10::elementSize(grad_dtype));
  flat_grad_ = torch::zeros({layout.padded_numel}, ctx_.options(grad_dtype));
  partition_ = std::make_unique<DeviceGradPartition>(
      flat_grad_.narrow(0, layout.begin(owner_), layout.partition_numel));
  point_grads_at_buffer();
}

// .grad of each parameter is its slice of flat_grad_, so autograd accumulates in place.
// Re-done before each backward in case the user reset the gradients (module.zero_grad()).
// In a wider buffer a .grad left from outside a backward the engine ran is added in instead.
void AllReduceBuckets::point_grads_at_buffer() {
  if (wider_) {
    for (size_t s = 0; s < flat_.slots().size(); ++s) take_grad(s);
    return;
  }
  for (auto& slot : flat_.slots()) {
    auto view = flat_grad_.narrow(0, slot.offset, slot.numel).view(slot.param.sizes());
    auto& g = slot.param.mutable_grad();
    if (!g.defined() || g.data_ptr() != view.data_ptr()) {
      if (g.defined()) view.copy_(g);
      g = view;
    }
  }
}

// A wider buffer: the parameter's fresh gradient is added into its slice (in the buffer's dtype,
// as DeepSpeed's BF16_Optimizer adds each micro-step's bf16 gradient into its fp32 one) and freed.
void AllReduceBuckets::arrived(size_t slot) {
  if (wider_) take_grad(slot);
}

void AllReduceBuckets::take_grad(size_t slot_index) {
  const auto& slot = flat_.slots()[slot_index];
  auto& g = slot.param.mutable_grad();
  if (!g.defined()) return;
  flat_grad_.narrow(0, slot.offset, slot.numel).add_(g.reshape({-1}));
  g = at::Tensor();
}

// Gradients accumulate over the micro-steps; only the boundary's backward reduces.
void AllReduceBuckets::begin_backward(bool boundary) {
  abandon_backward();
  point_grads_at_buffer();
  start(boundary, boundary);
}

at::Tensor AllReduceBuckets::range_of(const Bucket& b) {
  return flat_grad_.narrow(0, b.range.begin, b.range.end - b.range.begin);
}

// Gloo adds fp16 in fp16 in an all-reduce (the reduce-scatter adds in fp32): gradient_scaling
// then takes the mean before the sum.
void AllReduceBuckets::launch(Bucket& b) {
  const bool fp16_sum = comm_dtype_ == at::kHalf;
  const double before = gradient_scaling(options_, ctx_.world_size(), fp16_sum).before_reduce;
  auto range = range_of(b);
  if (comm_dtype_ != range.scalar_type()) {
    AllocatingFor naming("a gradient bucket in communication_data_type", -1, range.numel(),
                         c10::elementSize(comm_dtype_));
    b.wire = range.to(comm_dtype_);
    int64_t live = 0;  // this copy and those still in flight (at most kMaxBucketsInFlight)
    for (const auto& other : buckets_) live += storage_bytes(other.wire);
    peak_wire_bytes_ = std::max(peak_wire_bytes_, live);
    if (before != 1.0) b.wire.mul_(before);
    b.work = ctx_.comm->all_reduce(b.wire);
    return;
  }
  if (before != 1.0) range.mul_(before);
  b.work = ctx_.comm->all_reduce(range);
}

void AllReduceBuckets::finish(Bucket& b) {
  b.work->wait();
  b.work.reset();
  const bool fp16_sum = comm_dtype_ == at::kHalf;
  const double after = gradient_scaling(options_, ctx_.world_size(), fp16_sum).after_reduce;
  auto range = range_of(b);
  if (b.wire.defined()) {
    if (after != 1.0) b.wire.mul_(after);
    range.copy_(b.wire);
    b.wire = at::Tensor();
  } else if (after != 1.0) {
    range.mul_(after);
  }
  announce_final(b.range.begin, b.range.end);
}

int64_t AllReduceBuckets::gradient_bytes() const { return storage_bytes(flat_grad_); }

// ---- reduce-scatter every micro-step (stage 2) -----------------------------------------------

ReduceScatterBuckets::ReduceScatterBuckets(const StageContext& context, FlatParams& flat,
                                           const ReductionOptions& options,
                                           at::ScalarType comm_dtype, at::ScalarType grad_dtype,
                                           bool host_partition, bool pin)
    : FlatGradReducer(context, flat, context.rank(), options, comm_dtype,
                      options.overlap ? kMaxBucketsInFlight : 0,
                      /*hooked=*/true) {  // every gradient is caught as it is produced, to free it
  release_ = releases_gradients(options, ctx_.device);
  partition_ = make_grad_partition(flat_.layout().partition_numel, grad_dtype, ctx_.device,
                                   host_partition, pin, release_);
  for (auto& b : buckets_)
    max_bucket_numel_ = std::max(max_bucket_numel_, b.range.end - b.range.begin);
}

// Stage 2 never holds a full gradient: every micro-step reduces. Stage 1 only at the boundary.
void ReduceScatterBuckets::begin_backward(bool boundary) {
  if (leaves_to_autograd(boundary)) return;
  abandon_backward();  // before the partition's own recovery, which the finished buckets reach
  partition_->begin_micro_step(boundary);
  start(true, boundary);
}

// After a step every bucket is back in the pool: a releasing stage frees them all.
void ReduceScatterBuckets::zero() {
  partition_->clear();
  drop_accumulated_grads();
  if (!release_) return;
  for (const auto& buffer : pool_) pool_held_bytes_ -= storage_bytes(buffer);
  pool_.clear();
}

void ReduceScatterBuckets::drop_unlaunched() {
  for (auto& b : buckets_)
    if (b.pooled.defined()) {
      pool_.push_back(b.pooled);
      b.pooled = b.buffer = b.received = at::Tensor();
    }
}

// Lends the bucket a zeroed pool buffer; parameters that get no gradient stay zeros.
void ReduceScatterBuckets::borrow_buffer(Bucket& b) {
  if (pool_.empty()) {
    AllocatingFor naming("a gradient bucket (reduce_bucket_size)", -1, max_bucket_numel_,
                         c10::elementSize(comm_dtype_));
    pool_.push_back(torch::empty({max_bucket_numel_}, ctx_.options(comm_dtype_)));
    pool_held_bytes_ += storage_bytes(pool_.back());
    pool_bytes_ = std::max(pool_bytes_, pool_held_bytes_);
  }
  b.pooled = pool_.back();
  pool_.pop_back();
  b.buffer = b.pooled.narrow(0, 0, b.range.end - b.range.begin);
  b.buffer.zero_();
}

// The parameter's fresh gradient moves into its bucket and is freed at once.
void ReduceScatterBuckets::arrived(size_t slot_index) {
  Bucket& b = buckets_[order_->bucket_of(slot_index)];
  if (!b.buffer.defined()) borrow_buffer(b);
  take_grad(b, slot_index);
}

// Moves the slot's .grad (when it has one) into its part of the bucket's buffer and frees it.
void ReduceScatterBuckets::take_grad(Bucket& b, size_t slot_index) {
  const auto& slot = flat_.slots()[slot_index];
  auto& g = slot.param.mutable_grad();
  if (g.defined()) {
    b.buffer.narrow(0, slot.offset - b.range.begin, slot.numel).copy_(g.reshape({-1}));
    g = at::Tensor();
  }
}

// fp16: the communicator takes the mean itself (reduce_scatter_scaling), so a sum past 65504
// never reaches the fp16 `received`.
void ReduceScatterBuckets::launch(Bucket& b) {
  const auto scaling = reduce_scatter_scaling(options_, ctx_.world_size(), comm_dtype_);
  const double before = scaling.before_reduce;
  const auto& layout = flat_.layout();
  if (!b.buffer.defined()) borrow_buffer(b);  // no parameter of this bucket got a gradient
  // A parameter whose hook did not fire in this backward (its graph does not use it) may still
  // hold a gradient from backwards that did not reduce: a pipeline stage's micro-batches before
  // the last accumulate in .grad and only the last one's backward reduces. That sum goes with
  // this bucket (the hooked parameters' .grad were taken and freed: nothing is counted twice).
  for (size_t s : b.range.slots) take_grad(b, s);
  if (before != 1.0) b.buffer.mul_(before);
  std::vector<int64_t> splits;
  for (int r = 0; r < ctx_.world_size(); ++r)
    splits.push_back(layout.overlap(r, b.range.begin, b.range.end));
  b.received = torch::empty({splits[ctx_.rank()]}, ctx_.options(comm_dtype_));
  b.work = ctx_.comm->reduce_scatter_v(b.received, b.buffer, splits, scaling.op);
}

void ReduceScatterBuckets::finish(Bucket& b) {
  b.work->wait();
  b.work.reset();
  const double after =
      reduce_scatter_scaling(options_, ctx_.world_size(), comm_dtype_).after_reduce;
  const auto& layout = flat_.layout();
  std::shared_ptr<device::CopyFence> ready;
  if (b.received.numel() > 0) {
    const int64_t mine = layout.begin(owner_);
    const int64_t first = std::max(b.range.begin, mine) - mine;
    if (after != 1.0) b.received.mul_(after);
    ready = partition_->accumulate(first, b.received);
  }
  announce_final(b.range.begin, b.range.end, std::move(ready));
  pool_.push_back(b.pooled);
  b.pooled = at::Tensor();
  b.buffer = at::Tensor();
  b.received = at::Tensor();
}

int64_t ReduceScatterBuckets::gradient_bytes() const { return partition_->bytes(); }

}  // namespace zero
}  // namespace deepspeed
