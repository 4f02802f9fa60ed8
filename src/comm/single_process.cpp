// The world-size-1 communicator: every collective is its own result, so nothing leaves the
// process; calls are still counted so stats look the same as in a distributed run.
#include <fmt/format.h>

#include "comm/communicator_base.h"
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
    count("all_reduce", tensor);
    return done();  // Sum/Max/Min of one rank is itself; Avg divides by 1.
  }
  WorkPtr broadcast(at::Tensor& tensor, int root) override {
    check_peer("broadcast", root);
    count("broadcast", tensor);
    return done();
  }
  WorkPtr all_gather(at::Tensor& output, const at::Tensor& input) override {
    check_split("all_gather", output, input);
    count("all_gather", input);
    output.copy_(input.reshape(output.sizes()));
    return done();
  }
  WorkPtr reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp) override {
    check_split("reduce_scatter", input, output);
    count("reduce_scatter", input);
    output.copy_(input.reshape(output.sizes()));
    return done();
  }
  WorkPtr send(at::Tensor&, int dst, int) override { throw no_peer("send", dst); }
  WorkPtr recv(at::Tensor&, int src, int) override { throw no_peer("recv", src); }
  void barrier() override { stats_->add("barrier", 0); }
  // The only rank is alone in any group it joins.
  CommunicatorPtr split(int color, int) override {
    if (color < 0) return nullptr;
    return std::make_shared<SingleProcessCommunicator>(local_rank_);
  }

 private:
  static WorkPtr done() { return std::make_shared<DoneWork>(); }
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

}  // namespace comm
}  // namespace deepspeed
