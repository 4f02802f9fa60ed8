// A scripted Communicator for single-process tests: it plays rank `rank` of a world of
// `world_size` ranks, the other ranks' contributions coming from a function, and it records every
// call. Lives in tests/support, not src/comm: it is a test double (it never talks to a peer) and
// must not be reachable from a training program; tests link it through ds_test_support.
//
// Results are what a real world would compute: all_reduce reduces this rank's tensor with the
// peers' (16-bit floats summed in fp32, in rank order, as the Gloo communicator does);
// all_gather puts rank r's input in slice r; reduce_scatter(_v) reduces segment `rank` over all
// ranks' inputs; broadcast and recv copy the root's/source's tensor. Thread-safe (a mutex).
#pragma once
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator_base.h"

namespace dstest {

struct CallRecord {
  std::string kind;                  // "all_reduce", "broadcast", "all_gather", ...
  at::ScalarType dtype = at::kFloat; // of the tensor this rank passes (undefined kinds: kFloat)
  int64_t numel = 0;                 // of that tensor (gathers/scatters: the input)
  deepspeed::comm::ReduceOp op = deepspeed::comm::ReduceOp::Sum;
  int peer = -1;                     // broadcast root, send dst, recv src; split color
  std::vector<int64_t> splits;       // reduce_scatter_v
};

class FakeCommunicator : public deepspeed::comm::CommunicatorBase {
 public:
  // What rank `peer` passes to `call`, given this rank's tensor `mine` (same shape and dtype
  // expected). The default: exactly what this rank passes, a world of replicas in lockstep.
  using PeerInput =
      std::function<at::Tensor(const CallRecord& call, int peer, const at::Tensor& mine)>;
  // (color, key) that rank `peer` passes to split. The default: this rank's color, key = peer.
  using PeerSplit = std::function<std::pair<int, int>(int peer, int color, int key)>;

  FakeCommunicator(int rank, int world_size, PeerInput peers = {}, PeerSplit peer_split = {});

  std::vector<CallRecord> calls() const;
  void clear_calls();

  deepspeed::comm::WorkPtr all_reduce(
      at::Tensor& tensor, deepspeed::comm::ReduceOp op = deepspeed::comm::ReduceOp::Sum) override;
  deepspeed::comm::WorkPtr broadcast(at::Tensor& tensor, int root) override;
  deepspeed::comm::WorkPtr all_gather(at::Tensor& output, const at::Tensor& input) override;
  deepspeed::comm::WorkPtr reduce_scatter(
      at::Tensor& output, const at::Tensor& input,
      deepspeed::comm::ReduceOp op = deepspeed::comm::ReduceOp::Sum) override;
  deepspeed::comm::WorkPtr reduce_scatter_v(at::Tensor& output, const at::Tensor& input,
                                            const std::vector<int64_t>& input_splits,
                                            deepspeed::comm::ReduceOp op =
                                                deepspeed::comm::ReduceOp::Sum) override;
  deepspeed::comm::WorkPtr send(at::Tensor& tensor, int dst, int tag = 0) override;
  deepspeed::comm::WorkPtr recv(at::Tensor& tensor, int src, int tag = 0) override;
  void barrier() override;
  std::string backend() const override { return "fake"; }
  // A FakeCommunicator over the ranks whose color (PeerSplit) matches, its peers' inputs
  // coming from this one's PeerInput under their parent ranks. Records a "split" call.
  deepspeed::comm::CommunicatorPtr split(int color, int key) override;

 private:
  CallRecord record(const char* kind, const at::Tensor& t);
  at::Tensor input_of(const CallRecord& call, int r, const at::Tensor& mine) const;
  at::Tensor reduce_over_ranks(const CallRecord& call, const at::Tensor& mine, int64_t offset,
                               int64_t n) const;

  PeerInput peers_;
  PeerSplit peer_split_;
  mutable std::mutex mu_;
  std::vector<CallRecord> calls_;
};

}  // namespace dstest
