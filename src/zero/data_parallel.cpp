#include "zero/data_parallel.h"

#include <torch/torch.h>

#include <algorithm>

#include "device/out_of_memory.h"
#include "zero/backward_reach.h"
#include "zero/gradient_scaling.h"
#include "zero/optimizer_state_bytes.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {

DataParallelStage::DataParallelStage(std::vector<at::Tensor> params, const StageContext& context,
                                     const DataParallelOptions& options,
                                     std::shared_ptr<torch::optim::Optimizer> optimizer)
    : params_(std::move(params)), ctx_(context), options_(options),
      optimizer_(std::move(optimizer)) {
  self_comm_ = dynamic_cast<const optim::SelfCommunicatingOptimizer*>(optimizer_.get());
  build_buckets(options_.reduction.bucket_numel);
  if (options_.reduction.overlap && ctx_.world_size() > 1) {
    for (size_t i = 0; i < params_.size(); ++i)
      hooks_.add(params_[i], [this, i] {
        if (reducing_) order_->mark_ready(i, [this](size_t b) { launch_bucket(b); });
      });
  }
}

DataParallelStage::~DataParallelStage() {
  hooks_.clear();
  for (auto& b : buckets_) wait_quietly(b.work);
}

void DataParallelStage::launch_bucket(size_t b) {
  launch(buckets_[b]);
  in_flight_.push(b, [this](size_t i) { finish(buckets_[i]); });
}

// Buckets follow reverse registration order: autograd produces the last layers' gradients first,
// so the first bucket fills (and can be sent) earliest. At most bucket_size elements each (a
// larger parameter alone), as DeepSpeed reduces a bucket before it would overflow.
void DataParallelStage::build_buckets(int64_t bucket_size) {
  std::vector<size_t> bucket_of_param(params_.size(), 0);
  for (size_t k = params_.size(); k-- > 0;) {
    const auto& p = params_[k];
    bool fits = !buckets_.empty() && buckets_.back().dtype == p.scalar_type() &&
                buckets_.back().numel + p.numel() <= bucket_size;
    if (!fits) {
      buckets_.emplace_back();
      buckets_.back().dtype = p.scalar_type();
    }
    buckets_.back().params.push_back(k);
    buckets_.back().numel += p.numel();
    bucket_of_param[k] = buckets_.size() - 1;
  }
  for (const auto& b : buckets_)
    max_bucket_numel_[b.dtype] = std::max(max_bucket_numel_[b.dtype], b.numel);
  order_ = std::make_unique<BucketOrder>(std::move(bucket_of_param), buckets_.size());
}

// Lends the bucket a pool buffer of its dtype (a new one when all of them travel). A bucket
// whose last launch threw before it travelled still holds its buffer.
void DataParallelStage::borrow_buffer(Bucket& b) {
  if (b.pooled.defined()) return;
  auto it = std::find_if(pool_.begin(), pool_.end(),
                         [&](const at::Tensor& t) { return t.scalar_type() == b.dtype; });
  if (it == pool_.end()) {
    const int64_t numel = max_bucket_numel_.at(b.dtype);
    AllocatingFor naming("a gradient bucket (reduce_bucket_size)", -1, numel,
                         c10::elementSize(b.dtype));
    pool_.push_back(torch::empty({numel}, ctx_.options(b.dtype)));
    pool_bytes_ += storage_bytes(pool_.back());
    it = pool_.end() - 1;
  }
  b.pooled = std::move(*it);
  pool_.erase(it);
  b.flat = b.pooled.narrow(0, 0, b.numel);
}

void DataParallelStage::return_buffer(Bucket& b) {
  pool_.push_back(std::move(b.pooled));
  b.pooled = b.flat = at::Tensor();
}

void DataParallelStage::begin_backward(bool boundary) {
  // The last backward threw midway: the sums it launched are finished (every rank launched them
  // in the same order), their averages left in .grad as PyTorch leaves what a failed backward
  // computed; a new sum of the same bucket would be queued behind a stale entry.
  abandon_backward();
  reducing_ = boundary && !hooks_.empty() && !gradients_stay_local();
  order_->begin();
}

// A parameter the graph cannot reach contributes what its .grad holds now (earlier micro-steps'
// sum, or zeros), whether its bucket goes now or at end_backward.
void DataParallelStage::expect_gradients_from(const at::Tensor& root) {
  if (!reducing_) return;
  const BackwardReach reach(root);
  if (!reach.known()) return;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!reach.reaches(params_[i]))
      order_->mark_unreachable(i, [this](size_t b) { launch_bucket(b); });
}

void DataParallelStage::abandon_backward() {
  in_flight_.drain([this](size_t i) { finish(buckets_[i]); });
  reducing_ = false;
}

// Copies the bucket's gradients into its flat buffer (pre-scaled) and starts the sum.
// A parameter that got no gradient this step contributes zeros: every rank must send the
// same bucket layout whatever its own graph used.
void DataParallelStage::launch(Bucket& b) {
  borrow_buffer(b);
  // communication_data_type: the bucket travels (and is summed) in it, as DeepSpeed's
  // allreduce_bucket converts it. Gloo sums fp16 in fp16: the mean is then taken first.
  const auto comm_dtype = dtype_from_config(options_.reduction.comm_dtype, b.dtype);
  const double before =
      gradient_scaling(options_.reduction, ctx_.world_size(), comm_dtype == at::kHalf).before_reduce;
  int64_t offset = 0;
  for (size_t k : b.params) {
    auto& p = params_[k];
    auto slice = b.flat.narrow(0, offset, p.numel());
    if (p.grad().defined())
      slice.copy_(p.grad().reshape({-1}));
    else
      slice.zero_();
    if (before != 1.0) slice.mul_(before);
    offset += p.numel();
  }
  if (comm_dtype != b.dtype) {
    AllocatingFor naming("a gradient bucket in communication_data_type", -1, b.numel,
                         c10::elementSize(comm_dtype));
    b.wire = b.flat.to(comm_dtype);
    int64_t live = 0;  // this copy and those still in flight (at most kMaxBucketsInFlight)
    for (const auto& other : buckets_) live += storage_bytes(other.wire);
    peak_wire_bytes_ = std::max(peak_wire_bytes_, live);
    b.work = ctx_.comm->all_reduce(b.wire);
    return;
  }
  b.work = ctx_.comm->all_reduce(b.flat);
}

void DataParallelStage::finish(Bucket& b) {
  b.work->wait();
  b.work.reset();
  const bool fp16_sum = dtype_from_config(options_.reduction.comm_dtype, b.dtype) == at::kHalf;
  if (b.wire.defined()) {
    b.flat.copy_(b.wire);
    b.wire = at::Tensor();
  }
  const double after = gradient_scaling(options_.reduction, ctx_.world_size(), fp16_sum).after_reduce;
  if (after != 1.0) b.flat.mul_(after);
  int64_t offset = 0;
  for (size_t k : b.params) {
    auto& p = params_[k];
    auto reduced = b.flat.narrow(0, offset, p.numel()).view(p.sizes());
    if (p.grad().defined())
      p.mutable_grad().copy_(reduced);
    else
      p.mutable_grad() = reduced.clone();
    offset += p.numel();
  }
  return_buffer(b);  // the copies above are ordered before the buffer's next use (one stream)
}

void DataParallelStage::end_backward(bool boundary) {
  reducing_ = false;
  if (!boundary) return;
  // Alone, or with a 1-bit optimizer past its warm-up (it averages its momentum itself), the
  // gradients are this rank's own: nothing is reduced.
  if (ctx_.world_size() == 1 || gradients_stay_local())
    return give_unused_parameters_zero_gradients();
  // Without overlap (or for parameters whose hook never fired) the rest go out now, in order.
  order_->launch_rest([this](size_t b) { launch_bucket(b); });
  in_flight_.drain([this](size_t i) { finish(buckets_[i]); });
}

// DeepSpeed-ZeRO's rule for a parameter that got no gradient in a step, at every stage and world
// size: its gradient is zero and the update runs (AdamW's decoupled weight decay and the moments'
// decay still apply). Across ranks the bucket sums give it a zero gradient; alone, this does.
void DataParallelStage::give_unused_parameters_zero_gradients() {
  for (auto& p : params_)
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
}

at::Tensor DataParallelStage::global_grad_norm_tensor() {
  // After the all-reduce every rank holds the same averaged gradients: the local norm is global.
  // (With gradients_stay_local() it is this rank's own norm, as in DeepSpeed's 1-bit Adam.)
  // Summed as one tensor so there is a single host sync, not one per parameter.
  at::Tensor sq = torch::zeros({1}, ctx_.options(torch::kDouble));
  for (auto& p : params_)
    if (p.grad().defined()) sq += sum_of_squares(p.grad());
  return sq.sqrt_();
}

double DataParallelStage::global_grad_norm() { return global_grad_norm_tensor().item<double>(); }

void DataParallelStage::step(double grad_scale) {
  if (grad_scale != 1.0)
    for (auto& p : params_)
      if (p.grad().defined()) p.mutable_grad().mul_(grad_scale);
  TORCH_CHECK(optimizer_, "DataParallelStage::step without an optimizer (engine.step() should "
                          "have refused it)");
  optimizer_->step();
  for (auto& p : params_)
    if (p.grad().defined()) p.mutable_grad().zero_();
}

void DataParallelStage::discard_gradients() {
  for (auto& p : params_)
    if (p.grad().defined()) p.mutable_grad().zero_();
}

MemoryReport DataParallelStage::memory() const {
  MemoryReport r;
  for (auto& p : params_) {
    r.parameters += storage_bytes(p);
    r.gradients += storage_bytes(p.grad());
  }
  r.optimizer_states = optimizer_ ? optimizer_state_bytes(*optimizer_) : 0;
  r.comm_buffers = pool_bytes_ + peak_wire_bytes_;
  r.host_bytes = host_share(ctx_.device, r.total());
  return r;
}

}  // namespace zero
}  // namespace deepspeed
