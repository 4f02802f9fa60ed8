#include "comm/gloo_hierarchy.h"

#include <utility>

#include <fmt/format.h>

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
      host_(layout_.host_of[rank]),
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

WorkPtr HierarchicalCollectives::enqueue(std::function<void()> job, std::function<void()> finish) {
  std::promise<void> done;
  std::shared_future<void> future = done.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(job), std::move(done));
  }
  ready_.notify_one();
  return std::make_shared<QueuedWork>(std::move(future), std::move(finish));
}

void HierarchicalCollectives::run() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) {
      for (auto& queued : queue_)
        queued.second.set_exception(std::make_exception_ptr(
            CommError("the Gloo group was destroyed before this collective started")));
      queue_.clear();
      return;
    }
    auto [job, done] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    try {
      job();
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  }
}

WorkPtr HierarchicalCollectives::reduce_scatter_v(at::Tensor output, at::Tensor input,
                                                  std::vector<int64_t> splits, ReduceOp op,
                                                  std::function<void()> finish) {
  auto job = [this, output, input, splits, op]() mutable {
    const int world = static_cast<int>(splits.size());
    std::vector<int64_t> offset(world + 1, 0);
    for (int r = 0; r < world; ++r) offset[r + 1] = offset[r] + splits[r];
    // Within the host: local index l gets, summed over this host's ranks, the segments of the
    // ranks with local index l on hosts 0..H-1, in that order.
    const at::Tensor flat = input.reshape({-1});
    std::vector<at::Tensor> grouped;
    std::vector<int64_t> host_splits(layout_.per_host, 0);
    for (int l = 0; l < layout_.per_host; ++l)
      for (int h = 0; h < layout_.hosts; ++h) {
        const int r = layout_.ranks[h][l];
        grouped.push_back(flat.narrow(0, offset[r], splits[r]));
        host_splits[l] += splits[r];
      }
    at::Tensor within = at::cat(grouped);
    at::Tensor partial = at::empty({host_splits[local_]}, flat.options());
    const ReduceOp phase_op = op == ReduceOp::Avg ? ReduceOp::Sum : op;
    host_group_->reduce_scatter_v(partial, within, host_splits, phase_op)->wait();
    // Across: the H partial sums of this rank's segment, one from each host.
    std::vector<int64_t> across_splits(layout_.hosts);
    for (int h = 0; h < layout_.hosts; ++h) across_splits[h] = splits[layout_.ranks[h][local_]];
    at::Tensor result = at::empty({splits[rank_]}, flat.options());
    across_->reduce_scatter_v(result, partial, across_splits, phase_op)->wait();
    if (op == ReduceOp::Avg) divide_by(result, world);
    output.copy_(result.view(output.sizes()));
  };
  return enqueue(std::move(job), std::move(finish));
}

WorkPtr HierarchicalCollectives::gather_into(std::vector<at::Tensor> bufs,
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
  return enqueue(std::move(job), std::move(finish));
}

}  // namespace comm
}  // namespace deepspeed
