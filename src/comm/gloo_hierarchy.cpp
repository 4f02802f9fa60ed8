#include "comm/gloo_hierarchy.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "comm/gloo_communicator.h"
#include "comm/local_reduce.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace comm {

namespace {

// Waits for the job's end, then runs `finish` once; a failure is rethrown on every wait().
class QueuedWork : public Work {
 public:
  QueuedWork(std::shared_future<void> done, std::function<void()> finish)
      : done_(std::move(done)), finish_(std::move(finish)) {}
  void wait() override {
    done_.get();
    if (finish_) finish_();
    finish_ = nullptr;
  }

 private:
  std::shared_future<void> done_;
  std::function<void()> finish_;
};

}  // namespace

HierarchicalCollectives::HierarchicalCollectives(HostLayout layout, int rank,
                                                 CommunicatorPtr host_group, CommunicatorPtr across)
    : layout_(std::move(layout)),
      rank_(rank),
      local_(layout_.local_of[rank]),
      host_group_(std::move(host_group)),
      across_(std::move(across)),
      thread_([this] { run(); }) {}

HierarchicalCollectives::~HierarchicalCollectives() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  ready_.notify_all();
  thread_.join();
}

WorkPtr HierarchicalCollectives::enqueue(std::function<void()> job, OpDesc desc,
                                         std::function<void()> finish) {
  Job queued{std::move(job), std::move(desc), std::chrono::steady_clock::now(), {}};
  std::shared_future<void> future = queued.done.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(queued));
  }
  ready_.notify_one();
  return std::make_shared<QueuedWork>(std::move(future), std::move(finish));
}

void HierarchicalCollectives::run() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) {
      for (Job& queued : queue_)
        queued.done.set_exception(std::make_exception_ptr(CommError(failure_message(
            queued.desc, 0.0, "the Gloo group was destroyed before this collective started"))));
      queue_.clear();
      return;
    }
    Job job = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    try {
      job.run();
      job.done.set_value();
    } catch (...) {
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - job.queued;
      job.done.set_exception(std::make_exception_ptr(CommError(failure_message(
          job.desc, elapsed.count(),
          "within hosts, then across (DS_GLOO_HIERARCHICAL): " + current_exception_message()))));
    }
  }
}

namespace {

// Views of `parts` (consecutive pieces of one segment) covering its elements [lo, hi).
void append_range(const std::vector<at::Tensor>& parts, int64_t lo, int64_t hi,
                  std::vector<at::Tensor>& out) {
  int64_t start = 0;
  for (const at::Tensor& part : parts) {
    const int64_t end = start + part.numel();
    const int64_t from = std::max(lo, start), to = std::min(hi, end);
    if (from < to) out.push_back(part.narrow(0, from - start, to - from));
    start = end;
  }
}

// How many pieces the within-host reduce-scatter of `total` elements over `segments` ranks is cut
// into so that each fits `limit` bytes (the host group's shared-memory path; 0: it has none): a
// piece takes the same fraction of every segment, at most total / pieces + segments elements.
int64_t pieces_for(int64_t total, int64_t element_size, size_t limit, int segments) {
  const int64_t fits = static_cast<int64_t>(limit) / element_size - segments;
  if (limit == 0 || fits <= 0 || total == 0) return 1;
  return std::max<int64_t>(1, (total + fits - 1) / fits);
}

}  // namespace

WorkPtr HierarchicalCollectives::reduce_scatter_v(at::Tensor output, at::Tensor input,
                                                  std::vector<int64_t> splits, ReduceOp op,
                                                  OpDesc desc, std::function<void()> finish) {
  auto job = [this, output, input, splits, op]() mutable {
    const int world = static_cast<int>(splits.size());
    std::vector<int64_t> offset(world + 1, 0);
    for (int r = 0; r < world; ++r) offset[r + 1] = offset[r] + splits[r];
    // Within the host: local index l gets, summed over this host's ranks, the segments of the
    // ranks with local index l on hosts 0..H-1, in that order (segment l below).
    const at::Tensor flat = input.reshape({-1});
    const int per_host = layout_.per_host;
    std::vector<std::vector<at::Tensor>> segment(per_host);
    std::vector<int64_t> host_splits(per_host, 0);
    for (int l = 0; l < per_host; ++l)
      for (int h = 0; h < layout_.hosts; ++h) {
        const int r = layout_.ranks[h][l];
        segment[l].push_back(flat.narrow(0, offset[r], splits[r]));
        host_splits[l] += splits[r];
      }
    at::Tensor partial = at::empty({host_splits[local_]}, flat.options());
    const ReduceOp phase_op = op == ReduceOp::Avg ? ReduceOp::Sum : op;
    // In pieces that fit the host group's shared-memory path: larger, it would go over loopback
    // TCP (3.7x slower at 4 MB, docs/benchmarks.md "Shared-memory all-reduce").
    const int64_t pieces = pieces_for(offset[world], flat.element_size(),
                                      shm_allreduce_limit(*host_group_), per_host);
    std::vector<WorkPtr> works;
    for (int64_t j = 0; j < pieces; ++j) {
      std::vector<at::Tensor> parts;
      std::vector<int64_t> piece_splits(per_host);
      int64_t mine_lo = 0;
      for (int l = 0; l < per_host; ++l) {
        const int64_t lo = host_splits[l] * j / pieces, hi = host_splits[l] * (j + 1) / pieces;
        append_range(segment[l], lo, hi, parts);
        piece_splits[l] = hi - lo;
        if (l == local_) mine_lo = lo;
      }
      at::Tensor piece = parts.empty() ? flat.narrow(0, 0, 0) : at::cat(parts);
      at::Tensor out = partial.narrow(0, mine_lo, piece_splits[local_]);
      works.push_back(host_group_->reduce_scatter_v(out, piece, piece_splits, phase_op));
    }
    for (auto& w : works) w->wait();
    // Across: the H partial sums of this rank's segment, one from each host.
    std::vector<int64_t> across_splits(layout_.hosts);
    for (int h = 0; h < layout_.hosts; ++h) across_splits[h] = splits[layout_.ranks[h][local_]];
    // Received in place where the caller's output allows it (the caller reads it only after
    // its wait()).
    const bool in_place = output.is_contiguous() && output.scalar_type() == flat.scalar_type();
    at::Tensor result =
        in_place ? output.view({-1}) : at::empty({splits[rank_]}, flat.options());
    across_->reduce_scatter_v(result, partial, across_splits, phase_op)->wait();
    if (op == ReduceOp::Avg) divide_by(result, world);
    if (!in_place) output.copy_(result.view(output.sizes()));
  };
  return enqueue(std::move(job), std::move(desc), std::move(finish));
}

WorkPtr HierarchicalCollectives::gather_into(std::vector<at::Tensor> bufs, OpDesc desc,
                                             std::function<void()> finish) {
  auto job = [this, bufs] {
    // Across: this rank's chunk to the rank with its local index on every host, and theirs here.
    std::vector<at::Tensor> mine(layout_.hosts);
    for (int h = 0; h < layout_.hosts; ++h) mine[h] = bufs[layout_.ranks[h][local_]];
    across_->all_gather_into(mine, bufs[rank_])->wait();
    // Within: each host's chunks from the local rank that received them to the others here.
    std::vector<WorkPtr> works;
    for (int h = 0; h < layout_.hosts; ++h) {
      std::vector<at::Tensor> theirs(layout_.per_host);
      for (int l = 0; l < layout_.per_host; ++l) theirs[l] = bufs[layout_.ranks[h][l]];
      works.push_back(host_group_->all_gather_into(theirs, theirs[local_]));
    }
    for (auto& w : works) w->wait();
  };
  return enqueue(std::move(job), std::move(desc), std::move(finish));
}

}  // namespace comm
}  // namespace deepspeed
