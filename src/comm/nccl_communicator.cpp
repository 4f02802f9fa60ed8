#include "comm/nccl_communicator.h"

#include <fmt/format.h>

#ifdef USE_C10D_NCCL
#include <atomic>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "comm/all_to_all.h"
#include "comm/communicator_base.h"
#include "comm/local_reduce.h"
#include "comm/op_observer.h"
#include "comm/reduce_scatter_v.h"
#include "comm/split.h"
#include "comm/work.h"
#endif

namespace deepspeed {
namespace comm {

#ifdef USE_C10D_NCCL
namespace {

class NcclCommunicator : public CommunicatorBase {
 public:
  NcclCommunicator(c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg,
                   c10::intrusive_ptr<c10d::Store> store, int rank, int world, int local_rank,
                   c10::Device device, std::chrono::milliseconds timeout)
      : CommunicatorBase(rank, world, local_rank, timeout),
        pg_(std::move(pg)),
        store_(std::move(store)),
        device_(device) {}

  std::string backend() const override { return "nccl"; }

  WorkPtr all_reduce(at::Tensor& tensor, ReduceOp op) override {
    count("all_reduce", tensor);
    if (tensor.numel() == 0) return done();
    at::Tensor staged = on_device(tensor);
    std::vector<at::Tensor> bufs{staged};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    const int world = world_size_;
    return launch(describe("all_reduce", tensor), [&] { return pg_->allreduce(bufs, opts); },
                  [tensor, staged, op, world]() mutable {
                    if (op == ReduceOp::Avg) divide_by(staged, world);
                    if (!same_memory(staged, tensor)) tensor.copy_(staged);
                  });
  }

  WorkPtr broadcast(at::Tensor& tensor, int root) override {
    check_peer("broadcast", root);
    count("broadcast", tensor);
    if (tensor.numel() == 0) return done();
    at::Tensor staged = on_device(tensor);
    std::vector<at::Tensor> bufs{staged};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    return launch(describe("broadcast", tensor), [&] { return pg_->broadcast(bufs, opts); },
                  copy_back(tensor, staged));
  }

  WorkPtr all_gather(at::Tensor& output, const at::Tensor& input) override {
    check_split("all_gather", output, input);
    count("all_gather", input);
    if (input.numel() == 0) return done();
    at::Tensor out = on_device(output).view({-1});
    at::Tensor in = on_device(input).view({-1});
    // In place (input is this rank's slice of output) is what NCCL's all-gather allows too.
    return launch(describe("all_gather", input),
                  [&] { return pg_->_allgather_base(out, in); },
                  copy_back(output, out));
  }

  WorkPtr reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    check_split("reduce_scatter", input, output);
    count("reduce_scatter", input);
    if (output.numel() == 0) return done();
    at::Tensor out = on_device(output).view({-1});
    at::Tensor in = on_device(input).view({-1});
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(op);
    const int world = world_size_;
    return launch(describe("reduce_scatter", input),
                  [&] { return pg_->_reduce_scatter_base(out, in, opts); },
                  [output, out, op, world]() mutable {
                    if (op == ReduceOp::Avg) divide_by(out, world);
                    if (!same_memory(out, output)) output.copy_(out.view(output.sizes()));
                  });
  }

  // Uneven reduce-scatter: one uneven all-to-all (NCCL send/recv pairs), then a local sum of the
  // world_size received segments, accumulated in fp32 for 16-bit floats.
  WorkPtr reduce_scatter_v(at::Tensor& output, const at::Tensor& input,
                           const std::vector<int64_t>& input_splits, ReduceOp op) override {
    check_reduce_scatter_v(*this, output, input, input_splits);
    count("reduce_scatter_v", input);
    if (input.numel() == 0) return done();
    at::Tensor send = on_device(input.contiguous()).view({-1});
    const int64_t mine = input_splits[rank_];
    at::Tensor recv = at::empty({mine * world_size_}, send.options());
    std::vector<int64_t> in_counts = input_splits;
    std::vector<int64_t> out_counts(world_size_, mine);
    const int world = world_size_;
    return launch(describe("reduce_scatter_v", input),
                  [&] { return pg_->alltoall_base(recv, send, out_counts, in_counts); },
                  [output, recv, send, op, world, mine]() mutable {
                    if (mine == 0) return;
                    output.copy_(reduce_chunks(recv.view({world, mine}), op, world)
                                     .view(output.sizes()));
                  });
  }

  // Even all-to-all (1-bit Adam's compressed rows, ZeRO++'s qgZ): one NCCL all-to-all, not the
  // base's all-gather of world_size times the bytes.
  WorkPtr all_to_all(at::Tensor& output, const at::Tensor& input) override {
    check_all_to_all(*this, output, input);
    count("all_to_all", input);
    if (input.numel() == 0) return done();
    at::Tensor out = on_device(output).view({-1});
    at::Tensor in = on_device(input.contiguous()).view({-1});
    std::vector<int64_t> equal_splits;  // empty: world_size equal chunks
    return launch(describe("all_to_all", input),
                  [&] { return pg_->alltoall_base(out, in, equal_splits, equal_splits); },
                  copy_back(output, out));
  }

  WorkPtr send(at::Tensor& tensor, int dst, int tag) override {
    check_peer("send", dst);
    count("send", tensor);
    if (tensor.numel() == 0) return done();
    std::vector<at::Tensor> bufs{on_device(tensor.contiguous())};
    return launch(describe("send", tensor), [&] { return pg_->send(bufs, dst, tag); },
                  [bufs] {});  // keeps a staged copy alive until the send completes
  }

  WorkPtr recv(at::Tensor& tensor, int src, int tag) override {
    check_peer("recv", src);
    count("recv", tensor);
    if (tensor.numel() == 0) return done();
    at::Tensor staged = on_device(tensor);
    std::vector<at::Tensor> bufs{staged};
    return launch(describe("recv", tensor), [&] { return pg_->recv(bufs, src, tag); },
                  copy_back(tensor, staged));
  }

  void barrier() override {
    stats_->add("barrier", 0);
    // A one-element all-reduce on this rank's GPU, waited on the host: ProcessGroupNCCL's own
    // barrier guesses the device from the rank, which is wrong for ranks sharing a node unevenly.
    at::Tensor token = at::zeros({1}, at::TensorOptions().device(device_));
    std::vector<at::Tensor> bufs{token};
    launch(describe("barrier", at::Tensor()), [&] { return pg_->allreduce(bufs); }, nullptr)
        ->wait();
    token.cpu();  // the host waits for the device: a barrier, not a stream ordering
  }

  CommunicatorPtr split(int color, int key) override {
    return sub_group(split_over_store(
        *this, splits_++, color, key, [&](const std::string& prefix, int sub_rank, int sub_world) {
          return make_nccl_communicator_on(c10::make_intrusive<c10d::PrefixStore>(prefix, store_),
                                           sub_rank, sub_world, local_rank_, device_.index(),
                                           timeout_);
        }));
  }

 private:
  // The tensor itself when it is contiguous on this rank's GPU; otherwise a contiguous copy there
  // (copied back by copy_back on wait()).
  at::Tensor on_device(const at::Tensor& t) const {
    if (t.device() == device_ && t.is_contiguous()) return t;
    return t.to(device_, /*non_blocking=*/false, /*copy=*/false).contiguous();
  }

  static bool same_memory(const at::Tensor& a, const at::Tensor& b) {
    return a.device() == b.device() && a.data_ptr() == b.data_ptr() && b.is_contiguous();
  }

  static std::function<void()> copy_back(at::Tensor dst, at::Tensor staged) {
    return [dst, staged]() mutable {
      if (same_memory(staged, dst)) return;  // the collective ran in the caller's tensor
      dst.copy_(staged.view(dst.sizes()));
    };
  }

  // Every NCCL call is made with this rank's GPU current (ProcessGroupNCCL uses it for its
  // streams and the communicator).
  //
  // While latencies are wanted (the comms_logger: keep_latencies(), or its verbose observer), a
  // collective's latency is its own, as DeepSpeed's timed_op measures it: the host waits for the
  // current stream before the clock starts (work queued before the call is not the collective's;
  // DeepSpeed's timer starts with an event on that stream) and, in wait(), for the collective
  // itself before the clock stops (NCCL's wait() only makes the current stream wait for NCCL's;
  // DeepSpeed synchronizes the device there). Without them nothing waits: the collective stays
  // asynchronous, and the latency recorded is the host's, from the launch to wait()'s return.
  WorkPtr launch(OpDesc d, const Start& start, std::function<void()> finish) const {
    c10::cuda::CUDAGuard guard(device_);
    if (d.has_tensor && (stats_->keeps_latencies() || op_observer_set())) {
      sync_current_stream(device_);
      finish = [finish = std::move(finish), device = device_] {
        if (finish) finish();
        sync_current_stream(device);  // the stream wait() made wait for the collective
      };
    }
    return CommunicatorBase::launch(std::move(d), start, std::move(finish));
  }

  static void sync_current_stream(c10::Device device) {
    c10::cuda::CUDAGuard guard(device);
    c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
  }

  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::Device device_;
  std::atomic<int> splits_{0};
};

}  // namespace

bool nccl_built() { return true; }

CommunicatorPtr make_nccl_communicator_on(c10::intrusive_ptr<c10d::Store> store, int rank,
                                          int world_size, int local_rank, int device_index,
                                          std::chrono::milliseconds timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw CommError(
        fmt::format("NCCL group setup: rank {} is not in [0, world_size {})", rank, world_size));
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_index));
  auto start = std::chrono::steady_clock::now();
  try {
    c10::cuda::CUDAGuard guard(device);
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, opts);
    return std::make_shared<NcclCommunicator>(pg, store, rank, world_size, local_rank, device,
                                              timeout);
  } catch (...) {
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    throw CommError(fmt::format(
        "NCCL group setup on rank {} of {} (cuda:{}) failed after {:.1f} s (timeout {:g} s): {}",
        rank, world_size, device_index, elapsed.count(), timeout.count() / 1000.0,
        current_exception_message()));
  }
}

#else  // no NCCL in this libtorch, or no nccl.h at configure time

bool nccl_built() { return false; }

CommunicatorPtr make_nccl_communicator_on(c10::intrusive_ptr<c10d::Store>, int rank, int world_size,
                                          int, int, std::chrono::milliseconds) {
  throw CommError(fmt::format(
      "rank {} of {}: this build has no NCCL communicator (a libtorch without CUDA, or nccl.h "
      "was not found at configure time: DS_NCCL_INCLUDE_DIR): use \"gloo\" "
      "(DS_COMM_BACKEND=gloo) or build against a CUDA libtorch with its nccl.h (docs/gpu.md)",
      rank, world_size));
}

#endif

}  // namespace comm
}  // namespace deepspeed
