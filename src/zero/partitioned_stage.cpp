#include "zero/partitioned_stage.h"

#include <torch/torch.h>

#include "optim/fused_adam.h"
#include "zero/gradient_scaling.h"
#include "zero/optimizer_state_bytes.h"
#include "zero/swapped_optimizer.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {
namespace {
// Partitions are aligned to 16 elements (64 bytes): whole cache lines and AVX-512 vectors.
constexpr int64_t kAlignment = 16;
// Stage 2 with overlap_comm waits for the oldest bucket once this many are in flight, so at most
// this many bucket buffers (+ the one filling) exist: the rank never holds more than a few
// buckets of gradient. Without overlap each bucket is waited for as soon as it is launched.
constexpr size_t kMaxBucketsInFlight = 2;

at::ScalarType common_dtype(int stage, const std::vector<at::Tensor>& params) {
  at::ScalarType dtype = uniform_param_dtype(stage, params);
  if (stage == 0 && dtype == torch::kFloat)
    throw ConfigError("PartitionedStage runs stage 0 for 16-bit parameters only");
  return dtype;
}
}  // namespace

PartitionedStage::PartitionedStage(int stage, std::vector<at::Tensor> params,
                                   comm::CommunicatorPtr comm, const Config& config,
                                   const OptimizerFactory& make_optimizer)
    : stage_(stage), comm_(std::move(comm)), config_(config) {
  param_dtype_ = common_dtype(stage, params);
  // Stage 0 keeps everything on every rank: a single partition spanning the whole buffer.
  const int parts = partitioned() ? comm_->world_size() : 1;
  flat_ = std::make_unique<FlatParams>(params, parts, kAlignment);
  const auto& layout = flat_->layout();
  const int rank = partitioned() ? comm_->rank() : 0;
  at::Tensor own = flat_->partition(rank).detach();
  master_ = mixed_precision() ? own.to(torch::kFloat) : own;
  // Autograd accumulates gradients in the parameter dtype; stage 2's partition may be wider.
  at::ScalarType grad_dtype = param_dtype_;
  if (stage_ == 2 && !config_.grad_accum_dtype.empty())
    grad_dtype = dtype_from_config(config_.grad_accum_dtype, param_dtype_);
  comm_dtype_ = dtype_from_config(config_.communication_data_type, param_dtype_);
  if (stage_ <= 1) {
    flat_grad_ = torch::zeros({layout.padded_numel}, torch::TensorOptions().dtype(param_dtype_));
    grad_partition_ = flat_grad_.narrow(0, layout.begin(rank), layout.partition_numel);
    point_grads_at_flat_buffer();
  } else {
    grad_partition_ =
        torch::zeros({layout.partition_numel}, torch::TensorOptions().dtype(grad_dtype));
  }
  if (config_.zero_optimization.offload_optimizer.device == "nvme") {
    // The masters and moments live in a file; master_ stays an empty placeholder.
    master_ = torch::zeros({0});
    swapped_ = make_swapped_optimizer(config_, make_optimizer, own.numel(),
                                      [own](int64_t begin, int64_t n) { return own.narrow(0, begin, n); });
    optimizer_ = swapped_->options;
  } else {
    if (!mixed_precision()) master_.mutable_grad() = grad_partition_;
    optimizer_ = make_optimizer({master_});
    if (auto* fused = dynamic_cast<optim::FusedAdam*>(optimizer_.get()); fused && mixed_precision()) {
      fused->set_half_copy(master_, own);
      fused_half_copy_ = true;
    }
  }

  int64_t bucket = std::max<int64_t>(1, config_.zero_optimization.reduce_bucket_size);
  for (auto& range : make_bucket_ranges(*flat_, bucket)) {
    max_bucket_numel_ = std::max(max_bucket_numel_, range.end - range.begin);
    buckets_.push_back({range});
  }
  std::vector<size_t> bucket_of_slot(flat_->slots().size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t s : buckets_[b].range.slots) bucket_of_slot[s] = b;
  order_ = std::make_unique<BucketOrder>(std::move(bucket_of_slot), buckets_.size());

  // Stage 2 must catch every gradient as it is produced (to free it); stages 0/1 only for overlap.
  const bool overlap = config_.zero_optimization.overlap_comm_enabled();
  if (stage_ == 2 || overlap) {
    for (size_t s = 0; s < flat_->slots().size(); ++s)
      hooks_.add(flat_->slots()[s].param, [this, s] { on_grad_ready(s); });
  }
}

PartitionedStage::~PartitionedStage() {
  hooks_.clear();
  for (auto& b : buckets_)
    if (b.work) try { b.work->wait(); } catch (...) {}
}

// Stages 0/1: .grad of each parameter is its slice of flat_grad_, so autograd accumulates in place.
// Re-done before each backward in case the user reset the gradients (module.zero_grad()).
void PartitionedStage::point_grads_at_flat_buffer() {
  for (auto& slot : flat_->slots()) {
    auto view = flat_grad_.narrow(0, slot.offset, slot.numel).view(slot.param.sizes());
    auto& g = slot.param.mutable_grad();
    if (!g.defined() || g.data_ptr() != view.data_ptr()) {
      if (g.defined()) view.copy_(g);
      g = view;
    }
  }
}

void PartitionedStage::begin_backward(bool boundary) {
  if (stage_ <= 1) point_grads_at_flat_buffer();
  // Stage 2 reduces every micro-step (the rank never holds a full gradient); stages 0/1 only at
  // the boundary, after the gradients have accumulated.
  reducing_ = stage_ == 2 || boundary;
  order_->begin();
}

void PartitionedStage::on_grad_ready(size_t slot) {
  if (!reducing_) return;
  if (stage_ == 2) stage_gradient_into_bucket(slot);
  // Hooks exist for stage 2 (which always reduces as buckets fill: that bounds its memory;
  // overlap_comm only decides whether it waits at once) and for stage 1 with overlap_comm.
  order_->mark_ready(slot, [this](size_t b) { launch(buckets_[b]); });
}

// Lends the bucket a zeroed pool buffer; parameters that get no gradient stay zeros.
void PartitionedStage::borrow_buffer(Bucket& b) {
  if (pool_.empty()) {
    pool_.push_back(torch::empty({max_bucket_numel_}, torch::TensorOptions().dtype(comm_dtype_)));
    pool_bytes_ += storage_bytes(pool_.back());
  }
  b.pooled = pool_.back();
  pool_.pop_back();
  b.buffer = b.pooled.narrow(0, 0, b.range.end - b.range.begin);
  b.buffer.zero_();
}

// Stage 2: the parameter's fresh gradient moves into its bucket and is freed at once.
void PartitionedStage::stage_gradient_into_bucket(size_t slot_index) {
  const auto& slot = flat_->slots()[slot_index];
  Bucket& b = buckets_[order_->bucket_of(slot_index)];
  if (!b.buffer.defined()) borrow_buffer(b);
  auto& g = slot.param.mutable_grad();
  if (g.defined()) {
    b.buffer.narrow(0, slot.offset - b.range.begin, slot.numel).copy_(g.reshape({-1}));
    g = at::Tensor();
  }
}

// Stages 0/1 all-reduce in Gloo, which adds fp16 in fp16; the reduce-scatter adds in fp32.
static bool sums_in_fp16(int stage, at::ScalarType wire) { return stage <= 1 && wire == at::kHalf; }

void PartitionedStage::launch(Bucket& b) {
  const double before =
      gradient_scaling(config_, comm_->world_size(), sums_in_fp16(stage_, comm_dtype_)).before_reduce;
  const auto& layout = flat_->layout();
  if (stage_ <= 1) {
    auto range = flat_grad_.narrow(0, b.range.begin, b.range.end - b.range.begin);
    if (comm_dtype_ != range.scalar_type()) {
      b.wire = range.to(comm_dtype_);
      if (before != 1.0) b.wire.mul_(before);
      b.work = comm_->all_reduce(b.wire);
      return;
    }
    if (before != 1.0) range.mul_(before);
    b.work = comm_->all_reduce(range);
    return;
  }
  if (!b.buffer.defined()) borrow_buffer(b);  // no parameter of this bucket got a gradient
  if (before != 1.0) b.buffer.mul_(before);
  std::vector<int64_t> splits;
  for (int r = 0; r < comm_->world_size(); ++r)
    splits.push_back(layout.overlap(r, b.range.begin, b.range.end));
  b.received = torch::empty({splits[comm_->rank()]}, torch::TensorOptions().dtype(comm_dtype_));
  b.work = comm_->reduce_scatter_v(b.received, b.buffer, splits);
  in_flight_.push_back(static_cast<size_t>(&b - buckets_.data()));
  const size_t max_in_flight =
      config_.zero_optimization.overlap_comm_enabled() ? kMaxBucketsInFlight : 0;
  while (in_flight_.size() > max_in_flight) {
    finish(buckets_[in_flight_.front()]);
    in_flight_.pop_front();
  }
}

void PartitionedStage::finish(Bucket& b) {
  b.work->wait();
  b.work.reset();
  const double after =
      gradient_scaling(config_, comm_->world_size(), sums_in_fp16(stage_, comm_dtype_)).after_reduce;
  const auto& layout = flat_->layout();
  if (stage_ <= 1) {
    auto range = flat_grad_.narrow(0, b.range.begin, b.range.end - b.range.begin);
    if (b.wire.defined()) {
      if (after != 1.0) b.wire.mul_(after);
      range.copy_(b.wire);
      b.wire = at::Tensor();
    } else if (after != 1.0) {
      range.mul_(after);
    }
    return;
  }
  const int rank = comm_->rank();
  if (b.received.numel() > 0) {
    int64_t first = std::max(b.range.begin, layout.begin(rank)) - layout.begin(rank);
    auto target = grad_partition_.narrow(0, first, b.received.numel());
    if (after != 1.0) b.received.mul_(after);
    target.add_(b.received);
  }
  pool_.push_back(b.pooled);
  b.pooled = at::Tensor();
  b.buffer = at::Tensor();
  b.received = at::Tensor();
}

void PartitionedStage::end_backward(bool boundary) {
  if (!reducing_) return;
  reducing_ = false;
  // Buckets not launched yet: no overlap (stage 1), or a parameter unused by this graph whose
  // hook never fired (its gradient is zeros).
  order_->launch_rest([this](size_t b) { launch(buckets_[b]); });
  for (auto& b : buckets_)
    if (b.work) finish(b);
  in_flight_.clear();
}

// An inf or NaN in any rank's gradients makes the summed square non-finite on every rank, so this
// one all-reduce is also the overflow vote. Stage 0: every rank already holds the whole average.
double PartitionedStage::global_grad_norm() {
  at::Tensor sq = grad_partition_.to(torch::kDouble).pow(2).sum().reshape({1});
  if (partitioned()) comm_->all_reduce(sq)->wait();
  return std::sqrt(sq.item<double>());
}

void PartitionedStage::step(double grad_scale) {
  if (swapped_) {  // the kernel writes the updated (16-bit) values into this rank's partition
    swapped_->step(grad_partition_, own_partition(), grad_scale);
    all_gather_partitions(/*copy_master=*/false);
    discard_gradients();
    return;
  }
  if (!mixed_precision()) {
    if (grad_scale != 1.0) grad_partition_.mul_(grad_scale);
    optimizer_->step();
    all_gather_partitions(/*copy_master=*/false);
    discard_gradients();
    return;
  }
  // The optimizer works in fp32: a transient widened copy of the gradient partition (4Ψ/N for the
  // length of the update, as DeepSpeed's single_partition_of_fp32_groups gradient).
  at::Tensor grad32 = grad_partition_.to(torch::kFloat);
  if (grad32.data_ptr() == grad_partition_.data_ptr()) grad32 = grad32.clone();
  master_.mutable_grad() = grad32;
  auto* fused = dynamic_cast<optim::FusedAdam*>(optimizer_.get());
  if (fused)
    fused->set_grad_scale(static_cast<float>(grad_scale));
  else if (grad_scale != 1.0)
    grad32.mul_(grad_scale);
  optimizer_->step();
  master_.mutable_grad() = at::Tensor();
  all_gather_partitions(/*copy_master=*/!fused_half_copy_);
  discard_gradients();
}

at::Tensor PartitionedStage::own_partition() const {
  return flat_->partition(partitioned() ? comm_->rank() : 0);
}

void PartitionedStage::discard_gradients() {
  if (stage_ <= 1)
    flat_grad_.zero_();
  else
    grad_partition_.zero_();
}

// Every rank contributes its updated partition; chunk c of every partition travels in one
// all_gather of at most allgather_bucket_size elements.
void PartitionedStage::all_gather_partitions(bool copy_master) {
  torch::NoGradGuard no_grad;
  if (copy_master && mixed_precision()) own_partition().copy_(master_);
  const auto& layout = flat_->layout();
  const int world = comm_->world_size();
  if (world == 1 || !partitioned()) return;
  at::Tensor own = own_partition();
  at::Tensor& buffer = flat_->buffer();
  const int64_t P = layout.partition_numel;
  const int64_t chunk =
      std::max<int64_t>(1, std::min(P, config_.zero_optimization.allgather_bucket_size / world));
  for (int64_t c = 0; c < P; c += chunk) {
    const int64_t n = std::min(chunk, P - c);
    at::Tensor mine = own.narrow(0, c, n).clone();
    if (n == P) {
      comm_->all_gather(buffer, mine)->wait();  // partitions are contiguous: gather in place
      continue;
    }
    at::Tensor gathered = torch::empty({n * world}, buffer.options());
    comm_->all_gather(gathered, mine)->wait();
    for (int r = 0; r < world; ++r)
      buffer.narrow(0, layout.begin(r) + c, n).copy_(gathered.narrow(0, r * n, n));
  }
}

MemoryReport PartitionedStage::memory() const {
  MemoryReport r;
  r.parameters = storage_bytes(flat_->buffer());
  r.gradients = stage_ <= 1 ? storage_bytes(flat_grad_) : storage_bytes(grad_partition_);
  r.optimizer_states = optimizer_state_bytes(*optimizer_);
  if (mixed_precision()) r.optimizer_states += storage_bytes(master_);
  if (swapped_) r.optimizer_states = swapped_->adam->resident_bytes();  // the rest is on disk
  r.comm_buffers = pool_bytes_;
  return r;
}

}  // namespace zero
}  // namespace deepspeed
