#include "support/fake_communicator.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "comm/dtypes.h"
#include "comm/reduce_scatter_v.h"
#include "comm/split.h"
#include "comm/work.h"

namespace dstest {

namespace comm = deepspeed::comm;
using comm::ReduceOp;
using comm::WorkPtr;

namespace {
WorkPtr done() { return std::make_shared<comm::DoneWork>(); }
}  // namespace

FakeCommunicator::FakeCommunicator(int rank, int world_size, PeerInput peers, PeerSplit peer_split)
    : CommunicatorBase(rank, world_size, rank, std::chrono::seconds(30)),
      peers_(std::move(peers)),
      peer_split_(std::move(peer_split)) {
  if (rank < 0 || rank >= world_size)
    throw deepspeed::CommError(
        fmt::format("FakeCommunicator: rank {} is not in [0, {})", rank, world_size));
}

std::vector<CallRecord> FakeCommunicator::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

void FakeCommunicator::clear_calls() {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.clear();
}

CallRecord FakeCommunicator::record(const char* kind, const at::Tensor& t) {
  CallRecord c;
  c.kind = kind;
  if (t.defined()) {
    c.dtype = t.scalar_type();
    c.numel = t.numel();
  }
  return c;
}

at::Tensor FakeCommunicator::input_of(const CallRecord& call, int r, const at::Tensor& mine) const {
  if (r == rank_ || !peers_) return mine;
  at::Tensor t = peers_(call, r, mine);
  if (!t.defined() || t.numel() != mine.numel())
    throw deepspeed::CommError(fmt::format("FakeCommunicator: the script gave rank {} {} elements "
                                           "for {} #{} where rank {} passes {}",
                                           r, t.defined() ? t.numel() : 0, call.kind,
                                           calls_.size(), rank_, mine.numel()));
  return t.to(mine.scalar_type());
}

at::Tensor FakeCommunicator::reduce_over_ranks(const CallRecord& call, const at::Tensor& mine,
                                               int64_t offset, int64_t n) const {
  const at::ScalarType acc_type = comm::accumulate_dtype(mine.scalar_type());
  at::Tensor acc;
  for (int r = 0; r < world_size_; ++r) {
    at::Tensor x = input_of(call, r, mine).reshape({-1}).narrow(0, offset, n).to(acc_type);
    if (!acc.defined()) {
      acc = x.clone();
    } else if (call.op == ReduceOp::Max) {
      acc = at::maximum(acc, x);
    } else if (call.op == ReduceOp::Min) {
      acc = at::minimum(acc, x);
    } else {
      acc.add_(x);
    }
  }
  if (call.op == ReduceOp::Avg) {
    if (at::isFloatingType(acc_type))
      acc.div_(world_size_);
    else
      acc.div_(world_size_, "trunc");
  }
  return acc.to(mine.scalar_type());
}

WorkPtr FakeCommunicator::all_reduce(at::Tensor& tensor, ReduceOp op) {
  std::lock_guard<std::mutex> lock(mu_);
  count("all_reduce", tensor);
  CallRecord c = record("all_reduce", tensor);
  c.op = op;
  if (tensor.numel() > 0) {
    at::Tensor mine = tensor.clone();
    tensor.copy_(reduce_over_ranks(c, mine, 0, mine.numel()).view(tensor.sizes()));
  }
  calls_.push_back(c);
  return done();
}

WorkPtr FakeCommunicator::broadcast(at::Tensor& tensor, int root) {
  check_peer("broadcast", root);
  std::lock_guard<std::mutex> lock(mu_);
  count("broadcast", tensor);
  CallRecord c = record("broadcast", tensor);
  c.peer = root;
  if (root != rank_ && tensor.numel() > 0)
    tensor.copy_(input_of(c, root, tensor.clone()).view(tensor.sizes()));
  calls_.push_back(c);
  return done();
}

WorkPtr FakeCommunicator::all_gather(at::Tensor& output, const at::Tensor& input) {
  check_split("all_gather", output, input);
  std::lock_guard<std::mutex> lock(mu_);
  count("all_gather", input);
  CallRecord c = record("all_gather", input);
  const int64_t n = input.numel();
  at::Tensor mine = input.clone();
  at::Tensor flat = output.view({-1});
  for (int r = 0; r < world_size_ && n > 0; ++r)
    flat.narrow(0, r * n, n).copy_(input_of(c, r, mine).reshape({-1}));
  calls_.push_back(c);
  return done();
}

WorkPtr FakeCommunicator::reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  check_split("reduce_scatter", input, output);
  std::lock_guard<std::mutex> lock(mu_);
  count("reduce_scatter", input);
  CallRecord c = record("reduce_scatter", input);
  c.op = op;
  const int64_t n = output.numel();
  if (n > 0)
    output.copy_(reduce_over_ranks(c, input.contiguous(), rank_ * n, n).view(output.sizes()));
  calls_.push_back(c);
  return done();
}

WorkPtr FakeCommunicator::reduce_scatter_v(at::Tensor& output, const at::Tensor& input,
                                           const std::vector<int64_t>& input_splits,
                                           ReduceOp op) {
  const int64_t offset = comm::check_reduce_scatter_v(*this, output, input, input_splits);
  std::lock_guard<std::mutex> lock(mu_);
  count("reduce_scatter_v", input);
  CallRecord c = record("reduce_scatter_v", input);
  c.op = op;
  c.splits = input_splits;
  const int64_t n = output.numel();
  if (n > 0)
    output.copy_(reduce_over_ranks(c, input.contiguous(), offset, n).view(output.sizes()));
  calls_.push_back(c);
  return done();
}

WorkPtr FakeCommunicator::send(at::Tensor& tensor, int dst, int) {
  check_peer("send", dst);
  std::lock_guard<std::mutex> lock(mu_);
  count("send", tensor);
  CallRecord c = record("send", tensor);
  c.peer = dst;
  calls_.push_back(c);
  return done();
}

WorkPtr FakeCommunicator::recv(at::Tensor& tensor, int src, int) {
  check_peer("recv", src);
  std::lock_guard<std::mutex> lock(mu_);
  count("recv", tensor);
  CallRecord c = record("recv", tensor);
  c.peer = src;
  if (tensor.numel() > 0) tensor.copy_(input_of(c, src, tensor.clone()).view(tensor.sizes()));
  calls_.push_back(c);
  return done();
}

void FakeCommunicator::barrier() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_->add("barrier", 0);
  calls_.push_back(record("barrier", at::Tensor()));
}

comm::CommunicatorPtr FakeCommunicator::split(int color, int key) {
  std::vector<std::pair<int, int>> color_key(world_size_);
  for (int r = 0; r < world_size_; ++r) {
    color_key[r] = r == rank_ ? std::make_pair(color, key)
                   : peer_split_ ? peer_split_(r, color, key)
                                 : std::make_pair(color, r);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    CallRecord c = record("split", at::Tensor());
    c.peer = color;
    calls_.push_back(c);
  }
  if (color < 0) return nullptr;
  const std::vector<int> members = comm::split_members(color_key, color);
  PeerInput sub_peers;
  if (peers_) {
    sub_peers = [parent = peers_, members](const CallRecord& call, int peer,
                                           const at::Tensor& mine) {
      return parent(call, members[peer], mine);
    };
  }
  return std::make_shared<FakeCommunicator>(comm::index_in(members, rank_),
                                            static_cast<int>(members.size()), sub_peers);
}

}  // namespace dstest
