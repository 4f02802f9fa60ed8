// Collectives over c10d's ProcessGroupGloo, filling the gaps of its libtorch 1.13 version:
// - bf16/int16 are rejected: reductions run in fp32/int32 on a converted copy; everything that
//   only moves data (broadcast, all_gather, send/recv, the messages of reduce_scatter) moves
//   the bits as Half, which is exact.
// - zero-element collectives crash Gloo (SIGFPE, measured): every rank has the same shapes, so
//   all of them skip the call together.
// - no reduce_scatter: rank r receives slice r of every rank's input and sums the world_size
//   chunks locally. Each rank sends (w-1)/w of its input once, which is what a ring
//   reduce-scatter sends too, while all_reduce + slice would send twice that and reduce w times
//   more elements.
// - no _allgather_base, and the vector allgather gathers into a flat tensor of its own and then
//   copies it into the outputs (a second copy of every gathered unit, measured in the 1.13
//   source): all_gather receives rank r's slice straight into slice r of the caller's output.
//   Each rank still receives (w-1)/w of the output once; no extra buffer is allocated.
// - both, and all_to_all, move host tensors as point-to-point messages with every receive posted
//   first when the group spans hosts (gloo_exchange.h: Gloo's own alltoall and broadcasts ran
//   each direction of a link at half its rate); otherwise, and for CUDA tensors, they go
//   through alltoall_base and one broadcast per rank.
// - where every host runs the same number (>= 2) of the group's ranks, reduce-scatters and
//   all-gathers of host tensors go within each host and then across (gloo_hierarchy.h): each
//   host sends its link (H-1)/H of the data instead of L times that.
// - when every rank of the group is on this host, all-reduces, reduce_scatter_v, all-gathers and
//   all-to-alls (any size by default) go through a shared-memory segment (shm_allreduce.h): each
//   rank writes its part once and reads what it needs, where loopback TCP copies every byte
//   through the kernel twice per receiver.
// - split: a new ProcessGroupGloo per sub-group, over a PrefixStore of this group's store.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include "comm/gloo_communicator.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "comm/checked_communicator.h"
#include "comm/communicator_base.h"
#include "comm/connect_barrier.h"
#include "comm/dtypes.h"
#include "comm/gloo_exchange.h"
#include "comm/gloo_group_plan.h"
#include "comm/gloo_hierarchy.h"
#include "comm/local_reduce.h"
#include "comm/process_info.h"
#include "comm/all_gather_into.h"
#include "comm/all_to_all.h"
#include "comm/reduce_scatter_v.h"
#include "comm/shm_allreduce.h"
#include "comm/shm_segment.h"
#include "comm/split.h"
#include "comm/work.h"

namespace deepspeed {
namespace comm {
namespace {

class GlooCommunicator : public CommunicatorBase {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg,
                   c10::intrusive_ptr<c10d::Store> store,
                   std::shared_ptr<::gloo::transport::Device> device, int rank, int world,
                   int local_rank, std::chrono::milliseconds timeout,
                   std::shared_ptr<ShmAllReduce> shm, bool exchange, std::string host)
      : CommunicatorBase(rank, world, local_rank, timeout),
        pg_(std::move(pg)),
        store_(std::move(store)),
        device_(std::move(device)),
        host_(std::move(host)),
        shm_(std::move(shm)),
        exchange_enabled_(exchange) {}

  // A group whose job cannot continue (failure_board.h) has Gloo work queued that will never
  // finish: its ProcessGroupGloo's destructor would wait for it until Gloo's timeout, so the
  // process could not leave. It is left to the process's end instead.
  ~GlooCommunicator() override {
    hierarchy_.reset();  // its thread issues work on sub-groups of this group
    if (failure_board() && failure_board()->broken()) (void)pg_.release();
  }

  // Builds the two sub-groups of the within-host/across-hosts collectives (gloo_hierarchy.h) and
  // their thread. COLLECTIVE: every rank of a group whose plan has a hierarchy calls it at setup.
  void build_hierarchy(const HostLayout& layout) {
    const int host = layout.host_of[rank_], local = layout.local_of[rank_];
    auto group = [&](const std::string& name, int sub_rank, int sub_world) {
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("ds_hier/" + name, store_);
      return sub_group(make_gloo_communicator_on(prefixed, sub_rank, sub_world, local_rank_,
                                                 timeout_, device_, failure_board(),
                                                 channel_name_ + "/" + name, host_));
    };
    CommunicatorPtr within = group(fmt::format("host{}", host), local, layout.per_host);
    CommunicatorPtr across = group(fmt::format("across{}", local), host, layout.hosts);
    hierarchy_ = std::make_unique<HierarchicalCollectives>(layout, rank_, std::move(within),
                                                           std::move(across));
  }
  bool hierarchical() const { return hierarchy_ != nullptr; }

  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  // Its channel on the job's failure board; its sub-groups are named under it.
  void watch_as(std::shared_ptr<FailureBoard> board, std::string channel) {
    channel_name_ = std::move(channel);
    watch_with(std::move(board), channel_name_);
  }
  size_t shm_limit() const { return shm_ ? shm_->max_bytes() : 0; }
  size_t shm_gather_limit() const { return shm_ ? shm_->max_gather_bytes() : 0; }
  bool exchange_enabled() const { return exchange_enabled_; }
  // The shared-memory path's start (launch() for c10d works): an operation it refused (its group
  // already failed, an allocation) is withdrawn. One refused after publishing part of it was
  // refused because the group failed (progress() throws only then), which fails every later
  // operation of the group on every rank too.
  template <class Issue>
  static WorkPtr withdrawn_if_thrown(const OpDesc& d, Issue&& issue) {
    try {
      return issue();
    } catch (...) {
      withdraw(d);
      throw;
    }
  }
  // A collective on the shared-memory path: `issue(desc, finish)` gets the operation's
  // description and its latency timer; withdrawn if it throws.
  template <class Issue>
  WorkPtr through_shm(const char* op, const at::Tensor& t, Issue&& issue) {
    OpDesc d = describe(op, t);
    auto finish = timed(d, std::chrono::steady_clock::now(), nullptr);
    return withdrawn_if_thrown(d, [&] { return issue(d, std::move(finish)); });
  }
  std::string backend() const override { return "gloo"; }

  WorkPtr all_reduce(at::Tensor& tensor, ReduceOp op) override {
    count("all_reduce", tensor);
    if (tensor.numel() == 0) return done();
    if (shm_ && shm_->accepts(tensor)) {  // every rank decides alike: same shapes and dtypes
      return through_shm("all_reduce", tensor, [&](const OpDesc& d, auto finish) {
        return shm_->all_reduce(tensor, op, d, std::move(finish));
      });
    }
    at::ScalarType wire = reduce_dtype(tensor.scalar_type(), "all_reduce");
    at::Tensor staged = tensor.to(wire).contiguous();
    std::vector<at::Tensor> bufs{staged};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    const int world = world_size_;
    auto start = [&] { return pg_->allreduce(bufs, opts); };
    return launch(describe("all_reduce", tensor), start, [tensor, staged, op, world]() mutable {
      if (op == ReduceOp::Avg) divide_by(staged, world);
      if (!staged.is_same(tensor)) tensor.copy_(staged);
    });
  }

  WorkPtr broadcast(at::Tensor& tensor, int root) override {
    check_peer("broadcast", root);
    count("broadcast", tensor);
    if (tensor.numel() == 0) return done();
    at::Tensor staged = bits_view(tensor, bits_dtype(tensor.scalar_type(), "broadcast"));
    std::vector<at::Tensor> bufs{staged};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    auto start = [&] { return pg_->broadcast(bufs, opts); };
    return launch(describe("broadcast", tensor), start, copy_back(tensor, staged));
  }

  // Slice r of the output is rank r's input, received in place (this rank's own slice is copied
  // in): no flat copy of the gathered tensor exists besides the output itself.
  WorkPtr all_gather(at::Tensor& output, const at::Tensor& input) override {
    check_split("all_gather", output, input);
    count("all_gather", input);
    if (input.numel() == 0) return done();
    at::ScalarType wire = bits_dtype(input.scalar_type(), "all_gather");
    at::Tensor flat = bits_view(output, wire).view({-1});  // the output itself when contiguous
    const int64_t n = input.numel();
    copy_into_slice(flat.narrow(0, rank_ * n, n), bits_view(input, wire).view({-1}));
    std::vector<at::Tensor> slices;
    for (int r = 0; r < world_size_; ++r) slices.push_back(flat.narrow(0, r * n, n));
    return gather_into(describe("all_gather", input), slices,
                       exchanges_on(input) && exchanges_on(output), copy_back(output, flat));
  }

  // The same, rank r's input into outputs[r]: each view is received in place (staged through a
  // contiguous copy only when it is not contiguous).
  WorkPtr all_gather_into(const std::vector<at::Tensor>& outputs,
                          const at::Tensor& input) override {
    check_all_gather_into(*this, outputs, input);
    count("all_gather", input);
    if (input.numel() == 0) return done();
    at::ScalarType wire = bits_dtype(input.scalar_type(), "all_gather");
    std::vector<at::Tensor> targets(outputs.begin(), outputs.end());
    at::Tensor& own = targets[rank_];
    if (own.data_ptr() != input.data_ptr()) own.copy_(input.reshape(own.sizes()));
    std::vector<at::Tensor> bufs;
    for (const at::Tensor& t : targets)  // the target itself when contiguous
      bufs.push_back(bits_view(t, wire).view({-1}));
    auto copy_back_all = [targets, bufs]() mutable {
      for (size_t r = 0; r < targets.size(); ++r)
        if (!targets[r].is_contiguous())
          targets[r].copy_(bufs[r].view(targets[r].scalar_type()).view(targets[r].sizes()));
    };
    const bool on_host = exchanges_on(input) &&
                         std::all_of(targets.begin(), targets.end(),
                                     [](const at::Tensor& t) { return exchanges_on(t); });
    return gather_into(describe("all_gather", input), bufs, on_host, copy_back_all);
  }

  WorkPtr reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    check_split("reduce_scatter", input, output);
    count("reduce_scatter", input);
    if (output.numel() == 0) return done();
    at::ScalarType type = input.scalar_type();
    at::ScalarType wire = bits_dtype(type, "reduce_scatter");
    if (by_hierarchy(input, output)) {
      const std::vector<int64_t> counts(world_size_, output.numel());
      return through_hierarchy(describe("reduce_scatter", input), output, input, counts, op);
    }
    at::Tensor send = bits_view(input, wire).view({-1});
    at::Tensor recv = at::empty({input.numel()}, send.options());
    const int world = world_size_;
    auto finish = [output, recv, send, type, op, world]() mutable {
      at::Tensor chunks = recv.view(type).view({world, -1});
      output.copy_(reduce_chunks(chunks, op, world).view(output.sizes()));
    };
    if (exchanges(input)) {
      const std::vector<int64_t> counts(world_size_, output.numel());
      return exchange_segments(describe("reduce_scatter", input), send, counts, recv, finish);
    }
    std::vector<int64_t> equal_split;
    auto start = [&] { return pg_->alltoall_base(recv, send, equal_split, equal_split); };
    return launch(describe("reduce_scatter", input), start, finish);
  }

  // Uneven reduce-scatter as one uneven all-to-all (Gloo's alltoallv; zero-length segments work,
  // measured): rank r receives segment r from every rank and sums them locally, so each rank
  // sends only what others own — half the bytes of the all-reduce fallback.
  WorkPtr reduce_scatter_v(at::Tensor& output, const at::Tensor& input,
                           const std::vector<int64_t>& input_splits, ReduceOp op) override {
    const int64_t offset = check_reduce_scatter_v(*this, output, input, input_splits);
    count("reduce_scatter_v", input);
    if (input.numel() == 0) return done();  // same splits on every rank: all skip together
    // Shared memory when every rank is here; every rank decides alike (same input shape, dtype).
    if (shm_ && shm_->accepts(input) && output.scalar_type() == input.scalar_type() &&
        output.device().is_cpu()) {
      return through_shm("reduce_scatter_v", input, [&](const OpDesc& d, auto finish) {
        return shm_->reduce_scatter_v(output, input, offset, op, d, std::move(finish));
      });
    }
    at::ScalarType type = input.scalar_type();
    at::ScalarType wire = bits_dtype(type, "reduce_scatter_v");
    if (by_hierarchy(input, output)) {
      return through_hierarchy(describe("reduce_scatter_v", input), output, input, input_splits,
                               op);
    }
    at::Tensor send = bits_view(input.contiguous(), wire).view({-1});
    const int64_t mine = input_splits[rank_];
    at::Tensor recv = at::empty({mine * world_size_}, send.options());
    const int world = world_size_;
    auto finish = [output, recv, send, type, op, world, mine]() mutable {
      if (mine == 0) return;
      at::Tensor chunks = recv.view(type).view({world, mine});
      output.copy_(reduce_chunks(chunks, op, world).view(output.sizes()));
    };
    if (exchanges(input)) {
      return exchange_segments(describe("reduce_scatter_v", input), send, input_splits, recv,
                               finish);
    }
    std::vector<int64_t> in_counts = input_splits;
    std::vector<int64_t> out_counts(world_size_, mine);
    auto start = [&] { return pg_->alltoall_base(recv, send, out_counts, in_counts); };
    return launch(describe("reduce_scatter_v", input), start, finish);
  }

  // Equal chunks through alltoall_base (1.13's Gloo supports it on CPU, uint8 included).
  WorkPtr all_to_all(at::Tensor& output, const at::Tensor& input) override {
    check_all_to_all(*this, output, input);
    count("all_to_all", input);
    if (input.numel() == 0) return done();
    // Shared memory when every rank is here; every rank decides alike (same sizes).
    if (shm_ && shm_->accepts_all_to_all(input) && output.device().is_cpu()) {
      return through_shm("all_to_all", input, [&](const OpDesc& d, auto finish) {
        return shm_->all_to_all(output, input, d, std::move(finish));
      });
    }
    at::ScalarType wire = bits_dtype(input.scalar_type(), "all_to_all");
    at::Tensor send = bits_view(input.contiguous(), wire).view({-1});
    at::Tensor recv = at::empty({input.numel()}, send.options());
    const at::ScalarType type = input.scalar_type();
    // Through a view of the result shaped like the output: a strided output has no flat view.
    auto finish = [output, recv, send, type]() mutable {
      output.copy_(recv.view(type).view(output.sizes()));
    };
    if (exchanges(input) && exchanges(output)) {
      const std::vector<int64_t> counts(world_size_, input.numel() / world_size_);
      return exchange_segments(describe("all_to_all", input), send, counts, recv, finish);
    }
    std::vector<int64_t> equal_split;
    auto start = [&] { return pg_->alltoall_base(recv, send, equal_split, equal_split); };
    return launch(describe("all_to_all", input), start, finish);
  }

  WorkPtr send(at::Tensor& tensor, int dst, int tag) override {
    check_peer("send", dst);
    count("send", tensor);
    if (tensor.numel() == 0) return done();
    // Gloo's point-to-point takes host tensors only (measured with CUDA tensors: it fails).
    at::Tensor host = tensor.is_cuda() ? tensor.cpu() : tensor;
    std::vector<at::Tensor> bufs{bits_view(host, bits_dtype(tensor.scalar_type(), "send"))};
    auto start = [&] { return pg_->send(bufs, dst, tag); };
    return launch(describe_p2p("send", tensor, dst, true), start, [bufs] {});  // keeps a staged copy alive
  }

  WorkPtr recv(at::Tensor& tensor, int src, int tag) override {
    check_peer("recv", src);
    count("recv", tensor);
    if (tensor.numel() == 0) return done();
    if (tensor.is_cuda()) {  // received on the host, then copied to the device on wait()
      at::Tensor host = at::empty(tensor.sizes(), tensor.options().device(at::kCPU));
      std::vector<at::Tensor> bufs{bits_view(host, bits_dtype(tensor.scalar_type(), "recv"))};
      auto start = [&] { return pg_->recv(bufs, src, tag); };
      return launch(describe_p2p("recv", tensor, src, false), start,
                    [tensor, host]() mutable { tensor.copy_(host); });
    }
    at::Tensor staged = bits_view(tensor, bits_dtype(tensor.scalar_type(), "recv"));
    std::vector<at::Tensor> bufs{staged};
    auto start = [&] { return pg_->recv(bufs, src, tag); };
    return launch(describe_p2p("recv", tensor, src, false), start, copy_back(tensor, staged));
  }

  void barrier() override {
    stats_->add("barrier", 0);
    launch(
        describe("barrier", at::Tensor()), [&] { return pg_->barrier(); }, nullptr)
        ->wait();
  }

  CommunicatorPtr split(int color, int key) override {
    return sub_group(split_over_store(
        *this, splits_++, color, key, [&](const std::string& prefix, int sub_rank, int sub_world) {
          return make_gloo_communicator_on(c10::make_intrusive<c10d::PrefixStore>(prefix, store_),
                                           sub_rank, sub_world, local_rank_, timeout_, device_,
                                           failure_board(), channel_name_ + "/" + prefix, host_);
        }));
  }

 private:
  // all_gather's own slice: the input, unless the caller gathers in place (input is that slice).
  static void copy_into_slice(at::Tensor slice, const at::Tensor& input) {
    if (slice.data_ptr() == input.data_ptr()) return;
    const auto* in_lo = static_cast<const char*>(input.data_ptr());
    const auto* out_lo = static_cast<const char*>(slice.storage().data());
    const bool overlaps = in_lo < out_lo + slice.storage().nbytes() &&
                          out_lo < in_lo + input.numel() * input.element_size();
    slice.copy_(overlaps ? input.clone() : input);
  }

  // The transport of all_gather and all_gather_into: rank r's data into bufs[r] (contiguous
  // wire views; this rank's own filled already; `on_host`: all host tensors) within and across
  // hosts, by exchange(), or by one broadcast per rank.
  WorkPtr gather_into(OpDesc d, const std::vector<at::Tensor>& bufs, bool on_host,
                      std::function<void()> finish) {
    // Shared memory when every rank is here; every rank decides alike (same sizes).
    if (shm_ && on_host && shm_->accepts_gather(bufs[rank_])) {
      auto timed_finish = timed(d, std::chrono::steady_clock::now(), std::move(finish));
      return withdrawn_if_thrown(
          d, [&] { return shm_->all_gather(bufs, bufs[rank_], d, std::move(timed_finish)); });
    }
    if (hierarchy_ && on_host) {
      auto timed_finish = timed(d, std::chrono::steady_clock::now(), std::move(finish));
      return withdrawn_if_thrown(
          d, [&] { return hierarchy_->gather_into(bufs, d, std::move(timed_finish)); });
    }
    if (exchange_enabled_ && on_host) {
      const std::vector<at::Tensor> mine(world_size_, bufs[rank_]);
      return exchange(std::move(d), mine, bufs, std::move(finish));
    }
    auto start = [&](std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
      works.reserve(world_size_);  // a broadcast queued is a broadcast counted
      for (int r = 0; r < world_size_; ++r) {
        std::vector<at::Tensor> buf{bufs[r]};  // c10d's works keep the tensor alive
        c10d::BroadcastOptions opts;
        opts.rootRank = r;
        works.push_back(pg_->broadcast(buf, opts));
      }
    };
    return launch_all(std::move(d), start, std::move(finish));
  }
  // Whether a reduce-scatter goes within and across hosts (gloo_hierarchy.h): host tensors.
  bool by_hierarchy(const at::Tensor& input, const at::Tensor& output) const {
    return hierarchy_ && exchanges_on(input) && exchanges_on(output);
  }
  WorkPtr through_hierarchy(OpDesc d, const at::Tensor& output, const at::Tensor& input,
                            const std::vector<int64_t>& splits, ReduceOp op) {
    auto finish = timed(d, std::chrono::steady_clock::now(), nullptr);
    return withdrawn_if_thrown(d, [&] {
      return hierarchy_->reduce_scatter_v(output, input, splits, op, d, std::move(finish));
    });
  }
  // Whether `t` travels by exchange() (gloo_exchange.h) rather than by Gloo's collectives.
  bool exchanges(const at::Tensor& t) const { return exchange_enabled_ && exchanges_on(t); }
  // A collective as post_exchange's messages: sends[r] to and recvs[r] from each peer r; the
  // caller has filled its own recvs[rank] already. Tags follow the exchanges' order, which is
  // the same on every rank (the collectives' order).
  WorkPtr exchange(OpDesc d, const std::vector<at::Tensor>& sends,
                   const std::vector<at::Tensor>& recvs, std::function<void()> finish) {
    // Gloo's send and receive works end for good when a timed wait runs out (a slice of the
    // failure board's polling would close the pairs): waited on whole, as send/recv are.
    d.position.blocking = d.position.board != nullptr;
    // c10d takes int tags >= 0; ours stay below 2^31.
    const int tag = static_cast<int>(kExchangeTagBase + exchanges_++ % kExchangeTagSpan);
    auto start = [&](std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
      works.reserve(2 * (world_size_ - 1));
      auto post = [&](bool receive) {
        return [&, receive](const at::Tensor& t, int peer) {
          std::vector<at::Tensor> buf{t};  // c10d's works keep the tensor alive
          works.push_back(receive ? pg_->recv(buf, peer, tag) : pg_->send(buf, peer, tag));
        };
      };
      post_exchange(rank_, sends, recvs, post(true), post(false));
    };
    return launch_all(std::move(d), start, std::move(finish));
  }
  // The all-to-all under reduce_scatter(_v) and all_to_all: segment r of `send` (counts[r]
  // elements, in rank order) goes to rank r; row r of `recv` (counts[rank] elements each)
  // comes from rank r. This rank's own segment is copied into its row here.
  WorkPtr exchange_segments(OpDesc d, const at::Tensor& send, const std::vector<int64_t>& counts,
                            const at::Tensor& recv, std::function<void()> finish) {
    const int64_t mine = counts[rank_];
    std::vector<at::Tensor> sends, recvs;
    int64_t offset = 0;
    for (int r = 0; r < world_size_; ++r) {
      sends.push_back(send.narrow(0, offset, counts[r]));
      recvs.push_back(recv.narrow(0, r * mine, mine));
      offset += counts[r];
    }
    recvs[rank_].copy_(sends[rank_]);
    return exchange(std::move(d), sends, recvs, std::move(finish));
  }

  // On wait(): copies a staged buffer (a bits view of a non-contiguous tensor) back into `dst`.
  static std::function<void()> copy_back(at::Tensor dst, at::Tensor staged) {
    return [dst, staged]() mutable {
      if (dst.is_contiguous()) return;  // staged shares dst's storage
      dst.copy_(staged.view(dst.scalar_type()).view(dst.sizes()));
    };
  }

  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::string channel_name_;  // on the failure board: "w", "w/split0/1", ...
  c10::intrusive_ptr<c10d::Store> store_;  // the rendezvous store: sub-groups and comms_check
  std::shared_ptr<::gloo::transport::Device> device_;
  // This rank's host identity (shm_host_identity(), or a test's): its sub-groups plan with it.
  const std::string host_;
  std::atomic<int> splits_{0};
  std::atomic<uint32_t> exchanges_{0};  // exchange()'s sequence number: its tag
  // All-reduces and reduce_scatter_v up to its limit when every rank is on this host
  // (shm_allreduce.h); null otherwise or with DS_SHM_ALLREDUCE=0.
  std::shared_ptr<ShmAllReduce> shm_;
  const bool exchange_enabled_;  // plan_gloo_group: DS_GLOO_EXCHANGE, hosts spanned
  std::unique_ptr<HierarchicalCollectives> hierarchy_;  // plan_gloo_group: layout, setting
};

// Gloo writes to peer sockets without MSG_NOSIGNAL: when a peer dies, the next write would kill
// this process with SIGPIPE (seen in the tests) instead of failing the collective with EPIPE.
// Python ignores SIGPIPE at startup, which is why torch.distributed users never see this; do the
// same, unless the program installed its own handler.
void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
  });
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

}  // namespace

std::shared_ptr<::gloo::transport::Device> gloo_device_for(const std::string& master_addr) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    if (*ifname) return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  if (is_loopback(master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  // Not createDefaultDevice(): it binds to whatever this host's name resolves to, which on a
  // multi-homed host (or in a network namespace sharing the host's name) is often an address the
  // peers cannot reach. The interface that routes to the store's host is the one they can.
  return c10d::ProcessGroupGloo::createDeviceForHostname(local_address_towards(master_addr));
}

CommunicatorPtr make_gloo_communicator_on(c10::intrusive_ptr<c10d::Store> store, int rank,
                                          int world_size, int local_rank,
                                          std::chrono::milliseconds timeout,
                                          std::shared_ptr<::gloo::transport::Device> device,
                                          std::string host) {
  // A root group: the job's failure board lives in its store, and its sub-groups share it.
  auto board = std::make_shared<FailureBoard>(store, rank, world_size, timeout);
  return make_gloo_communicator_on(std::move(store), rank, world_size, local_rank, timeout,
                                   std::move(device), std::move(board), "w", std::move(host));
}

CommunicatorPtr make_gloo_communicator_on(c10::intrusive_ptr<c10d::Store> store, int rank,
                                          int world_size, int local_rank,
                                          std::chrono::milliseconds timeout,
                                          std::shared_ptr<::gloo::transport::Device> device,
                                          std::shared_ptr<FailureBoard> board,
                                          std::string channel, std::string host) {
  if (host.empty()) host = shm_host_identity();
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw CommError(
        fmt::format("Gloo group setup: rank {} is not in [0, world_size {})", rank, world_size));
  }
  ignore_sigpipe_once();
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(std::move(device));
  auto start = std::chrono::steady_clock::now();
  try {
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, opts);
    wait_for_every_rank_connected(*store, rank, world_size, timeout);
    auto shm = ShmAllReduce::create(*store, rank, world_size, timeout, host);
    const GlooGroupPlan plan =
        plan_gloo_group(*store, rank, world_size, gloo_exchange_mode_from_env(),
                        gloo_hierarchical_from_env(), host);
    auto comm = std::make_shared<GlooCommunicator>(pg, store, opts->devices.front(), rank,
                                                   world_size, local_rank, timeout, std::move(shm),
                                                   plan.exchange, host);
    comm->watch_as(std::move(board), std::move(channel));
    if (plan.hierarchy) comm->build_hierarchy(*plan.hierarchy);
    return comm;
  } catch (...) {
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    throw CommError(fmt::format(
        "Gloo group setup on rank {} of {} failed after {:.1f} s (timeout {:g} s): {}", rank,
        world_size, elapsed.count(), timeout.count() / 1000.0, current_exception_message()));
  }
}

c10::intrusive_ptr<c10d::Store> store_of(const Communicator& comm) {
  if (auto* gloo = dynamic_cast<const GlooCommunicator*>(&comm)) return gloo->store();
  return {};
}

std::shared_ptr<FailureBoard> failure_board_of(const Communicator& comm) {
  if (auto* gloo = dynamic_cast<const GlooCommunicator*>(&comm)) return gloo->failure_board();
  if (auto* checked = dynamic_cast<const CheckedCommunicator*>(&comm))
    return failure_board_of(checked->inner());
  return nullptr;
}

std::string why_next_collective_is_stuck(const Communicator& comm) {
  auto* gloo = dynamic_cast<const GlooCommunicator*>(&comm);
  if (!gloo) return "";
  const OpPosition pos = gloo->next_position();
  return pos.board ? pos.board->why_stuck(pos) : "";
}

bool gloo_hierarchical(const Communicator& comm) {
  if (auto* gloo = dynamic_cast<const GlooCommunicator*>(&comm)) return gloo->hierarchical();
  if (auto* checked = dynamic_cast<const CheckedCommunicator*>(&comm))
    return gloo_hierarchical(checked->inner());
  return false;
}

bool gloo_exchanges_host_tensors(const Communicator& comm) {
  if (auto* gloo = dynamic_cast<const GlooCommunicator*>(&comm)) return gloo->exchange_enabled();
  if (auto* checked = dynamic_cast<const CheckedCommunicator*>(&comm))
    return gloo_exchanges_host_tensors(checked->inner());
  return false;
}

size_t shm_allreduce_limit(const Communicator& comm) {
  if (auto* gloo = dynamic_cast<const GlooCommunicator*>(&comm)) return gloo->shm_limit();
  return 0;
}

size_t shm_allgather_limit(const Communicator& comm) {
  if (auto* gloo = dynamic_cast<const GlooCommunicator*>(&comm)) return gloo->shm_gather_limit();
  return 0;
}

CommunicatorPtr make_gloo_communicator(c10::intrusive_ptr<c10d::Store> store, int rank,
                                       int world_size, std::chrono::milliseconds timeout,
                                       int local_rank) {
  return make_gloo_communicator_on(std::move(store), rank, world_size, local_rank, timeout,
                                   gloo_device_for("127.0.0.1"));
}

}  // namespace comm
}  // namespace deepspeed
