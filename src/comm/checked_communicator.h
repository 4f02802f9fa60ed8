// The desync checker behind with_comms_check() (deepspeed/comm.h): a Communicator that, before
// forwarding each collective to the one it wraps, compares the call with every other rank's
// through the group's store.
//
// Protocol for the n-th collective on a communicator (n counts from 1, the same on every rank by
// construction): rank r sets "<n>/<r>" to "kind|n|dtype|numel|detail" and its "last/<r>" to the
// same, then polls until every rank's "<n>/*" key exists (at most the communicator's timeout),
// reads them and compares. A rank that never posts is named as missing, with its "last/" call.
// Once a rank sees every "<n+1>/*" key, every rank has read "<n>/*", so it deletes its own
// "<n>/<r>": at most two keys per rank live in the store.
//
// Thread-safety: collectives may come from several threads; one mutex makes the check and the
// issue of a collective one step, so sequence numbers follow the issue order.
#pragma once
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "deepspeed/comm.h"

namespace c10d {
class Store;
}

namespace deepspeed {
namespace comm {

// One rank's description of a collective call.
struct CallDesc {
  std::string kind;    // "all_reduce", "all_gather", ...
  int64_t seq = 0;     // n-th collective on this communicator
  std::string dtype;   // "float", "bfloat16", "" for barrier/split
  int64_t numel = 0;   // elements this rank passes (the input of gathers and scatters)
  std::string detail;  // reduce op, broadcast root, reduce_scatter_v splits; "" if none

  std::string encode() const;
  static CallDesc decode(const std::string& s);
  // "all_reduce #7 (float, 1024 elements, sum)"
  std::string str() const;
  bool operator==(const CallDesc& o) const;
};

// Given every rank's description of the same call, "" when they agree, else the message naming
// the diverging rank and both calls (the same text on every rank). The reference is the
// description most ranks share (ties: the lowest rank's); the diverging rank is the lowest rank
// that differs from it.
std::string describe_mismatch(const std::vector<CallDesc>& calls);

class CheckedCommunicator : public Communicator {
 public:
  // `store`: a store every rank of `inner` shares, used for nothing else.
  CheckedCommunicator(CommunicatorPtr inner, c10::intrusive_ptr<c10d::Store> store);

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  int local_rank() const override { return inner_->local_rank(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  CommStats stats() const override { return inner_->stats(); }
  std::string backend() const override { return inner_->backend(); }
  void reset_stats() override { inner_->reset_stats(); }
  int64_t stats_resets() const override { return inner_->stats_resets(); }
  void keep_latencies() override { inner_->keep_latencies(); }
  double total_ms(const std::string& op_prefix) const override {
    return inner_->total_ms(op_prefix);
  }
  const Communicator& inner() const { return *inner_; }

  WorkPtr all_reduce(at::Tensor& tensor, ReduceOp op) override;
  WorkPtr broadcast(at::Tensor& tensor, int root) override;
  WorkPtr all_gather(at::Tensor& output, const at::Tensor& input) override;
  WorkPtr all_gather_into(const std::vector<at::Tensor>& outputs,
                          const at::Tensor& input) override;
  WorkPtr reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override;
  WorkPtr reduce_scatter_v(at::Tensor& output, const at::Tensor& input,
                           const std::vector<int64_t>& input_splits, ReduceOp op) override;
  WorkPtr all_to_all(at::Tensor& output, const at::Tensor& input) override;
  WorkPtr send(at::Tensor& tensor, int dst, int tag) override;
  WorkPtr recv(at::Tensor& tensor, int src, int tag) override;
  void barrier() override;
  CommunicatorPtr split(int color, int key) override;

 private:
  // Publishes this rank's call, waits for every rank's, throws CommError on a mismatch or a
  // missing rank. REQUIRES: mu_ held.
  void check(const std::string& kind, const at::Tensor& t, const std::string& detail);
  std::vector<CallDesc> gather_calls(const CallDesc& mine);
  std::string key(int64_t seq, int rank) const;

  CommunicatorPtr inner_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::mutex mu_;
  int64_t seq_ = 0;
  int splits_ = 0;
};

class Topology;

// The desync checker asked for (`from_config`: by "comms_check": true, else by DS_COMMS_CHECK=1)
// where the groups come from a topology the caller built (`what`: "initialize():
// InitializeArgs.topology"): they are checked only when its world was wrapped by
// with_comms_check() before the topology split them (CheckedCommunicator::split wraps every
// group it makes); a group already split cannot be wrapped after the fact. Throws ConfigError
// naming the switch, `what` and the fix otherwise.
void require_checked_topology(const Topology& topology, const std::string& what, bool from_config);

}  // namespace comm
}  // namespace deepspeed
