// Reduce-scatters and all-gathers of a Gloo group whose H hosts run L ranks each (L >= 2), in two
// phases over two sub-groups of the group: the ranks of this host (shared memory / loopback), and
// the ranks with this rank's local index, one per host (the link).
//
// Why: sent rank to rank, each of a host's L ranks sends its chunks to each rank of the other
// hosts, so a host puts L (H-1)/H of the data on its link per collective, L times what it must:
// - reduce-scatter: sum within the host first (each local index l collects, summed over this
//   host's ranks, the chunks of the ranks with local index l on every host), then one partial sum
//   per chunk across to its rank, which adds the H partial sums;
// - all-gather: each chunk across once, to the rank with the same local index on every host, then
//   within each host to the other local ranks.
// Each host then sends (H-1)/H of the data: at 2 hosts x 2 ranks half, at 8 ranks per host an
// eighth (docs/decisions.md). The second phase needs the first's result, so both run on a thread
// of this object, one collective at a time in the order they were issued (the same on every rank,
// so the sub-groups' operations line up); the Work a caller gets waits for it. Only this thread
// issues operations on the two sub-groups.
#pragma once
#include <ATen/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/gloo_group_plan.h"
#include "comm/work.h"
#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

class HierarchicalCollectives {
 public:
  // host_group: this host's ranks (sub-rank = local index); across: the ranks with this rank's
  // local index (sub-rank = host number).
  HierarchicalCollectives(HostLayout layout, int rank, CommunicatorPtr host_group,
                          CommunicatorPtr across);
  // Queued collectives that have not started fail with CommError; the running one finishes.
  ~HierarchicalCollectives();

  // reduce_scatter_v's contract (input in rank order, splits[r] elements for rank r); the
  // result is written into `output` by the thread; `finish` runs on the caller's wait() after.
  // Partial sums travel in the input's dtype (16-bit ones are rounded once more than a flat
  // reduce-scatter's). Avg sums both phases and divides by the world size once. A failure is
  // CommError naming `desc` (the caller's collective on the whole group), then the phase's own.
  WorkPtr reduce_scatter_v(at::Tensor output, at::Tensor input, std::vector<int64_t> splits,
                           ReduceOp op, OpDesc desc, std::function<void()> finish);
  // All-gather into bufs[r] (rank r's data; contiguous, equal sizes; this rank's own filled).
  WorkPtr gather_into(std::vector<at::Tensor> bufs, OpDesc desc, std::function<void()> finish);

 private:
  WorkPtr enqueue(std::function<void()> job, OpDesc desc, std::function<void()> finish);
  void run();

  const HostLayout layout_;
  const int rank_, local_;  // this rank, and its index on its host
  CommunicatorPtr host_group_, across_;
  std::mutex mu_;
  std::condition_variable ready_;
  struct Job {
    std::function<void()> run;
    OpDesc desc;
    std::chrono::steady_clock::time_point queued;
    std::promise<void> done;
  };
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace comm
}  // namespace deepspeed
