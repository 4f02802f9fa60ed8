// The world-size-1 communicator: every collective is its own result, so nothing leaves the
// process; calls are still counted and timed so stats (and the comms_logger table) look the same
// as in a distributed run.
#include <fmt/format.h>

#include <chrono>
#include <functional>

#include "comm/all_to_all.h"
#include "comm/communicator_base.h"
#include "comm/reduce_scatter_v.h"
#include "comm/single_process.h"
#include "comm/work.h"

namespace deepspeed {
namespace comm {
namespace {

class SingleProcessCommunicator : public CommunicatorBase {
 public:
  explicit SingleProcessCommunicator(int local_rank)
      : CommunicatorBase(0, 1, local_rank, std::chrono::minutes(30)) {}
  std::string backend() const override { return "single"; }

  WorkPtr all_reduce(at::Tensor& tensor, ReduceOp) override {
    // Sum/Max/Min of one rank is itself; Avg divides by 1.
    return local("all_reduce", tensor, nullptr);
  }
  WorkPtr broadcast(at::Tensor& tensor, int root) override {
    check_peer("broadcast", root);
    return local("broadcast", tensor, nullptr);
  }
  WorkPtr all_gather(at::Tensor& output, const at::Tensor& input) override {
    check_split("all_gather", output, input);
    return local("all_gather", input, [&] { output.copy_(input.reshape(output.sizes())); });
  }
  WorkPtr reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp) override {
    check_split("reduce_scatter", input, output);
    return local("reduce_scatter", input, [&] { output.copy_(input.reshape(output.sizes())); });
  }
  // The only segment is the whole input, this rank's own: a copy (the default would all-reduce a
  // clone of the input and count an all_reduce).
  WorkPtr reduce_scatter_v(at::Tensor& output, const at::Tensor& input,
                           const std::vector<int64_t>& input_splits, ReduceOp) override {
    check_reduce_scatter_v(*this, output, input, input_splits);
    return local("reduce_scatter_v", input,
                 [&] { output.copy_(input.reshape(output.sizes())); });
  }
  // The only chunk goes to this rank: a copy (the default would all-gather the input).
  WorkPtr all_to_all(at::Tensor& output, const at::Tensor& input) override {
    check_all_to_all(*this, output, input);
    return local("all_to_all", input, [&] { output.copy_(input.reshape(output.sizes())); });
  }
  WorkPtr send(at::Tensor&, int dst, int) override { throw no_peer("send", dst); }
  WorkPtr recv(at::Tensor&, int src, int) override { throw no_peer("recv", src); }
  void barrier() override { stats_->add("barrier", 0); }
  // The only rank is alone in any group it joins.
  CommunicatorPtr split(int color, int) override {
    if (color < 0) return nullptr;
    return sub_group(std::make_shared<SingleProcessCommunicator>(local_rank_));
  }

 private:
  // Counts `op` on `t` (the tensor its bytes are counted on, as the other backends count it) and
  // runs `work` (a copy, or nothing) under the comms logger's clock: DeepSpeed's comms logger
  // times the ops of a group of one too. A collective of no elements is counted, not timed, as
  // the other backends skip it.
  WorkPtr local(const char* op, const at::Tensor& t, const std::function<void()>& work) {
    count(op, t);
    if (t.numel() == 0) return done();
    const auto t0 = std::chrono::steady_clock::now();
    timed(describe(op, t), t0, work)();
    return done();
  }
  static CommError no_peer(const char* op, int peer) {
    return CommError(
        fmt::format("{}: there is no rank {} in a single-process job (world size 1)", op, peer));
  }
};

}  // namespace

CommunicatorPtr make_single_process_communicator() { return make_single_process_communicator(0); }

CommunicatorPtr make_single_process_communicator(int local_rank) {
  return std::make_shared<SingleProcessCommunicator>(local_rank);
}

CommunicatorPtr make_group_of_one(const Communicator& parent) {
  auto one = std::make_shared<SingleProcessCommunicator>(parent.local_rank());
  StatsRecorder::adopt(recorder_of(parent), one->recorder());
  return one;
}

}  // namespace comm
}  // namespace deepspeed
