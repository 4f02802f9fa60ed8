#include "comm/checked_communicator.h"
#include "comm/store_bytes.h"

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 10+ keeps it there)

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/dtypes.h"
#include "util/env_flag.h"
#include "comm/failure_board.h"
#include "comm/gloo_communicator.h"
#include "deepspeed/topology.h"

namespace deepspeed {
namespace comm {
namespace {

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::Avg:
      return "avg";
    default:
      return "sum";
  }
}

std::string string_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// Polls instead of Store::wait: a TCPStore wait that times out leaves its reply pending on the
// socket, and the key check that names the missing rank must still work afterwards. The first
// polls only yield (peers usually arrive within microseconds), later ones back off to 2 ms.
class Poll {
 public:
  void pause() {
    if (++polls_ < 64) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(2000));
  }

 private:
  int polls_ = 0;
  std::chrono::microseconds sleep_{20};
};

}  // namespace

std::string CallDesc::encode() const {
  return fmt::format("{}|{}|{}|{}|{}", kind, seq, dtype, numel, detail);
}

CallDesc CallDesc::decode(const std::string& s) {
  std::vector<std::string> f;
  std::stringstream in(s);
  std::string part;
  while (f.size() < 4 && std::getline(in, part, '|')) f.push_back(part);
  std::getline(in, part);  // the detail may contain anything
  if (f.size() != 4) throw CommError("comms_check: unreadable call description '" + s + "'");
  CallDesc d;
  d.kind = f[0];
  d.seq = std::stoll(f[1]);
  d.dtype = f[2];
  d.numel = std::stoll(f[3]);
  d.detail = part;
  return d;
}

std::string CallDesc::str() const {
  std::string what = fmt::format("{} #{}", kind, seq);
  if (dtype.empty()) return detail.empty() ? what : fmt::format("{} ({})", what, detail);
  what += fmt::format(" ({}, {} elements", dtype, numel);
  if (!detail.empty()) what += ", " + detail;
  return what + ")";
}

bool CallDesc::operator==(const CallDesc& o) const {
  return kind == o.kind && seq == o.seq && dtype == o.dtype && numel == o.numel &&
         detail == o.detail;
}

std::string describe_mismatch(const std::vector<CallDesc>& calls) {
  const int w = static_cast<int>(calls.size());
  int ref = 0, ref_count = 0;
  for (int r = 0; r < w; ++r) {
    const int n = static_cast<int>(std::count(calls.begin(), calls.end(), calls[r]));
    if (n > ref_count) ref = r, ref_count = n;  // strict: ties keep the lowest rank
  }
  if (ref_count == w) return "";
  std::string msg;
  for (int r = 0; r < w; ++r) {
    if (calls[r] == calls[ref]) continue;
    if (msg.empty()) {
      msg = fmt::format("rank {} issued {} but rank {} issued {}", r, calls[r].str(), ref,
                        calls[ref].str());
    } else {
      msg += fmt::format("; rank {} issued {}", r, calls[r].str());
    }
  }
  return msg;
}

CheckedCommunicator::CheckedCommunicator(CommunicatorPtr inner,
                                         c10::intrusive_ptr<c10d::Store> store)
    : inner_(std::move(inner)), store_(std::move(store)) {}

std::string CheckedCommunicator::key(int64_t seq, int rank) const {
  return fmt::format("{}/{}", seq, rank);
}

std::vector<CallDesc> CheckedCommunicator::gather_calls(const CallDesc& mine) {
  const int w = world_size(), me = rank();
  store_->set(key(mine.seq, me), store_bytes(mine.encode()));
  store_->set(fmt::format("last/{}", me), store_bytes(mine.encode()));
  std::vector<std::string> others;
  for (int r = 0; r < w; ++r)
    if (r != me) others.push_back(key(mine.seq, r));
  const auto start = std::chrono::steady_clock::now();
  auto next_board_check = start + kFailureCheckSlice;
  for (Poll poll; !store_->check(others); poll.pause()) {
    const auto now = std::chrono::steady_clock::now();
    // A peer whose engine call failed before this collective will never post it
    // (failure_board.h): say so now, not at the timeout.
    if (now >= next_board_check) {
      next_board_check = now + kFailureCheckSlice;
      const std::string why = why_next_collective_is_stuck(*inner_);
      if (!why.empty())
        throw CommError(fmt::format("comms_check on rank {} of {}: rank {} issued {}: {}", me, w,
                                    me, mine.str(), why));
    }
    const auto waited = now - start;
    if (waited < timeout()) continue;
    std::string missing;
    for (int r = 0; r < w; ++r) {
      if (r == me || store_->check({key(mine.seq, r)})) continue;
      const std::string last = fmt::format("last/{}", r);
      missing += fmt::format(
          "; rank {} did not reach it within {:g} s ({})", r, timeout().count() / 1000.0,
          store_->check({last})
              ? "its last collective was " + CallDesc::decode(string_of(store_->get(last))).str()
              : "it has issued no collective on this communicator");
    }
    throw CommError(fmt::format("comms_check on rank {} of {}: rank {} issued {}{}", me, w, me,
                                mine.str(), missing));
  }
  std::vector<CallDesc> calls(w);
  for (int r = 0; r < w; ++r)
    calls[r] = r == me ? mine : CallDesc::decode(string_of(store_->get(key(mine.seq, r))));
  // Every rank posted call n, so every rank has read call n-1's keys: this rank's can go.
  if (mine.seq > 1) store_->deleteKey(key(mine.seq - 1, me));
  return calls;
}

void CheckedCommunicator::check(const std::string& kind, const at::Tensor& t,
                                const std::string& detail) {
  CallDesc mine;
  mine.kind = kind;
  mine.seq = ++seq_;
  if (t.defined()) {
    mine.dtype = dtype_name(t.scalar_type());
    mine.numel = t.numel();
  }
  mine.detail = detail;
  const std::string msg = describe_mismatch(gather_calls(mine));
  if (!msg.empty())
    throw CommError(fmt::format("comms_check on rank {} of {}: {}", rank(), world_size(), msg));
}

WorkPtr CheckedCommunicator::all_reduce(at::Tensor& tensor, ReduceOp op) {
  std::lock_guard<std::mutex> lock(mu_);
  check("all_reduce", tensor, op_name(op));
  return inner_->all_reduce(tensor, op);
}

WorkPtr CheckedCommunicator::broadcast(at::Tensor& tensor, int root) {
  std::lock_guard<std::mutex> lock(mu_);
  check("broadcast", tensor, fmt::format("root {}", root));
  return inner_->broadcast(tensor, root);
}

WorkPtr CheckedCommunicator::all_gather(at::Tensor& output, const at::Tensor& input) {
  std::lock_guard<std::mutex> lock(mu_);
  check("all_gather", input, "");
  return inner_->all_gather(output, input);
}

// Checked as an all_gather: its peers may gather the same input either way.
WorkPtr CheckedCommunicator::all_gather_into(const std::vector<at::Tensor>& outputs,
                                             const at::Tensor& input) {
  std::lock_guard<std::mutex> lock(mu_);
  check("all_gather", input, "");
  return inner_->all_gather_into(outputs, input);
}

WorkPtr CheckedCommunicator::reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                            ReduceOp op) {
  std::lock_guard<std::mutex> lock(mu_);
  check("reduce_scatter", input, op_name(op));
  return inner_->reduce_scatter(output, input, op);
}

WorkPtr CheckedCommunicator::reduce_scatter_v(at::Tensor& output, const at::Tensor& input,
                                              const std::vector<int64_t>& input_splits,
                                              ReduceOp op) {
  std::lock_guard<std::mutex> lock(mu_);
  check("reduce_scatter_v", input,
        fmt::format("{}, splits {}", op_name(op), fmt::join(input_splits, "+")));
  return inner_->reduce_scatter_v(output, input, input_splits, op);
}

WorkPtr CheckedCommunicator::all_to_all(at::Tensor& output, const at::Tensor& input) {
  std::lock_guard<std::mutex> lock(mu_);
  check("all_to_all", input, "");
  return inner_->all_to_all(output, input);
}

// Point to point involves two ranks only: nothing to compare across the group.
WorkPtr CheckedCommunicator::send(at::Tensor& tensor, int dst, int tag) {
  return inner_->send(tensor, dst, tag);
}
WorkPtr CheckedCommunicator::recv(at::Tensor& tensor, int src, int tag) {
  return inner_->recv(tensor, src, tag);
}

void CheckedCommunicator::barrier() {
  std::lock_guard<std::mutex> lock(mu_);
  check("barrier", at::Tensor(), "");
  inner_->barrier();
}

CommunicatorPtr CheckedCommunicator::split(int color, int key) {
  std::lock_guard<std::mutex> lock(mu_);
  check("split", at::Tensor(), "");
  const int n = splits_++;
  CommunicatorPtr sub = inner_->split(color, key);
  if (!sub || sub->world_size() == 1) return sub;
  c10::intrusive_ptr<c10d::Store> sub_store =
      c10::make_intrusive<c10d::PrefixStore>(fmt::format("split{}/{}", n, color), store_);
  return std::make_shared<CheckedCommunicator>(sub, sub_store);
}

CommunicatorPtr with_comms_check(CommunicatorPtr comm) {
  if (!comm || comm->world_size() == 1) return comm;
  if (dynamic_cast<CheckedCommunicator*>(comm.get())) return comm;
  c10::intrusive_ptr<c10d::Store> store = store_of(*comm);
  if (!store)
    throw CommError(fmt::format(
        "comms_check on rank {} of {}: the communicator is not a Gloo one, and the checker "
        "exchanges call descriptions through a Gloo group's store",
        comm->rank(), comm->world_size()));
  // Each checker counts its calls from 1 and leaves its last keys in the store, so a second
  // checker over the same communicator (build_engine wraps the world once per engine) needs keys
  // of its own: "comms_check/<k>/", k counting the checkers made over this store by this rank.
  // Every rank wraps a communicator in the same order (with_comms_check is called alike on every
  // rank, like the collectives it checks), so every rank reaches the same k. The count lives in
  // the store, per rank, rather than in a process-wide counter: ranks run as threads of one
  // process in the tests, and a communicator's address may be reused after it is gone.
  const int64_t k = store->add(fmt::format("comms_check/checkers/{}", comm->rank()), 1);
  return std::make_shared<CheckedCommunicator>(
      comm, c10::make_intrusive<c10d::PrefixStore>(fmt::format("comms_check/{}", k), store));
}

void require_checked_topology(const Topology& topology, const std::string& what,
                              bool from_config) {
  const Communicator& world = *topology.world();
  if (world.world_size() == 1 || dynamic_cast<const CheckedCommunicator*>(&world)) return;
  const char* by = from_config ? "\"comms_check\": true" : "DS_COMMS_CHECK=1";
  throw ConfigError(fmt::format(
      "{}: {} cannot check this topology's groups: its world (rank {} of {}) was not wrapped by "
      "comm::with_comms_check() before the topology split its groups, and a group already split "
      "cannot be checked; build it as Topology(comm::with_comms_check(world), sizes), or turn {} "
      "off",
      what, by, world.rank(), world.world_size(), by));
}

bool comms_check_from_env() {
  return util::flag_from_env("DS_COMMS_CHECK", false, "check every collective", "the default");
}

}  // namespace comm
}  // namespace deepspeed
