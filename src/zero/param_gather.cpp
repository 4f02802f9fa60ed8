#include "zero/param_gather.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "zero/in_flight.h"

namespace deepspeed {
namespace zero {

ParamGather::ParamGather(const StageContext& context, FlatParams& flat, int owner,
                         int64_t chunk_numel)
    : ctx_(context),
      flat_(flat),
      owner_(owner),
      chunk_(std::max<int64_t>(1, std::min(chunk_numel, flat.layout().partition_numel))) {
  order_chunks([](int64_t, int64_t) { return int64_t{0}; });
}

void ParamGather::set_forward_order(const ReadOrder& first_read) { order_chunks(first_read); }

// Chunks sorted by their soonest read, ties largest offset first.
void ParamGather::order_chunks(const ReadOrder& first_read) {
  const auto& layout = flat_.layout();
  const int64_t count = (layout.partition_numel + chunk_ - 1) / chunk_;
  std::vector<std::pair<int64_t, int64_t>> keyed;  // (first read, -index)
  for (int64_t k = 0; k < count; ++k) {
    const int64_t offset = k * chunk_, n = std::min(chunk_, layout.partition_numel - offset);
    int64_t soonest = std::numeric_limits<int64_t>::max();
    for (int r = 0; r < layout.world_size; ++r)
      soonest = std::min(soonest,
                         first_read(layout.begin(r) + offset, layout.begin(r) + offset + n));
    keyed.emplace_back(soonest, -k);
  }
  std::sort(keyed.begin(), keyed.end());
  launch_order_.clear();
  position_.assign(count, 0);
  for (const auto& key : keyed) {
    position_[-key.second] = static_cast<int64_t>(launch_order_.size());
    launch_order_.push_back(-key.second);
  }
}

ParamGather::~ParamGather() {
  for (size_t i = finished_; i < chunks_.size(); ++i) wait_quietly(chunks_[i].work);
}

ParamGather::Chunk ParamGather::start(int64_t offset) {
  torch::NoGradGuard no_grad;
  const auto& layout = flat_.layout();
  Chunk c;
  c.offset = offset;
  c.numel = std::min(chunk_, layout.partition_numel - offset);
  at::Tensor& buffer = flat_.buffer();
  if (c.numel == layout.partition_numel) {  // partitions are contiguous: gathered in place
    at::Tensor mine = flat_.partition(owner_);
    c.work = ctx_.comm->all_gather(buffer, mine);
    return c;
  }
  // Chunk `offset` of every rank's partition, straight into the buffer where the backend can
  // (Gloo); otherwise through its temporary (comm.h). The owner's chunk is the input: the step
  // that wrote it is over, and nothing writes the partition until the gather is finished.
  std::vector<at::Tensor> views;
  views.reserve(ctx_.world_size());
  for (int r = 0; r < ctx_.world_size(); ++r)
    views.push_back(buffer.narrow(0, layout.begin(r) + offset, c.numel));
  c.work = ctx_.comm->all_gather_into(views, views[owner_]);
  return c;
}

void ParamGather::finish(Chunk& c) {
  torch::NoGradGuard no_grad;
  c.work->wait();
  c.work.reset();
}

void ParamGather::gather() {
  complete_step();
  if (ctx_.world_size() == 1) return;
  for (int64_t offset = 0; offset < flat_.layout().partition_numel; offset += chunk_) {
    Chunk c = start(offset);
    finish(c);
  }
}

void ParamGather::launch() {
  complete_step();
  chunks_.clear();
  finished_ = 0;
  if (ctx_.world_size() == 1) return;
  for (int64_t k : launch_order_) chunks_.push_back(start(k * chunk_));
}

void ParamGather::settle(int64_t begin, int64_t end) {
  if (!in_flight() || begin >= end) return;
  const auto& layout = flat_.layout();
  // The chunk launched last among those holding [begin, end).
  int64_t needed = -1;
  for (int r = 0; r < ctx_.world_size(); ++r) {
    const int64_t lo = std::max(begin, layout.begin(r)), hi = std::min(end, layout.end(r));
    if (lo >= hi) continue;
    const int64_t first = chunk_index(lo - layout.begin(r));
    const int64_t last = chunk_index(hi - 1 - layout.begin(r));
    for (int64_t k = first; k <= last; ++k) needed = std::max(needed, position_[k]);
  }
  while (static_cast<int64_t>(finished_) <= needed) finish(chunks_[finished_++]);
}

void ParamGather::complete_step() {
  while (in_flight()) finish(chunks_[finished_++]);
}

}  // namespace zero
}  // namespace deepspeed
