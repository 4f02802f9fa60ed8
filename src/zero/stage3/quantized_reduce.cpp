#include "zero/stage3/quantized_reduce.h"

#include <torch/torch.h>

#include <algorithm>

#include "comm/quantize.h"

namespace deepspeed {
namespace zero {
namespace {

class QuantizedReduceWork : public comm::Work {
 public:
  QuantizedReduceWork(comm::WorkPtr inner, at::Tensor send, at::Tensor recv, at::Tensor sum,
                      at::Tensor output, int rank, int world, int bits)
      : inner_(std::move(inner)),
        send_(std::move(send)),
        recv_(std::move(recv)),
        sum_(std::move(sum)),
        output_(std::move(output)),
        rank_(rank),
        world_(world),
        bits_(bits) {}

  void wait() override {
    if (!inner_) return;
    inner_->wait();
    inner_.reset();
    const int64_t bytes = recv_.numel() / world_;
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      comm::dequantize(recv_.narrow(0, r * bytes, bytes), sum_, bits_, comm::kQuantBlock,
                       /*add=*/true);
    }
    output_.copy_(sum_.narrow(0, 0, output_.numel()));
    send_ = recv_ = sum_ = at::Tensor();
  }

 private:
  comm::WorkPtr inner_;
  at::Tensor send_, recv_;  // wire forms, world_size chunks each
  at::Tensor sum_;          // fp32, the largest split: own segment + the others' dequantized
  at::Tensor output_;
  int rank_, world_, bits_;
};

// Hop 1 in flight; wait() finishes it, runs hop 2 and writes the output (quantized_reduce.h).
class TwoHopWork : public comm::Work {
 public:
  TwoHopWork(comm::WorkPtr hop1, const QgzHops& hops, at::Tensor send1, at::Tensor recv1,
             at::Tensor partial, at::Tensor output, int64_t chunk)
      : hop1_(std::move(hop1)),
        hops_(hops),
        send1_(std::move(send1)),
        recv1_(std::move(recv1)),
        partial_(std::move(partial)),
        output_(std::move(output)),
        chunk_(chunk) {}

  void wait() override {
    if (!hop1_) return;
    hop1_->wait();
    hop1_.reset();
    const int local = hops_.intra->world_size(), l = hops_.intra->rank();
    const int nodes = hops_.inter->world_size(), n = hops_.inter->rank();
    const int64_t bytes1 = recv1_.numel() / local;
    for (int p = 0; p < local; ++p)
      if (p != l)
        comm::dequantize(recv1_.narrow(0, p * bytes1, bytes1), partial_, 4, comm::kQuantBlock,
                         /*add=*/true);
    const int64_t bytes2 = comm::quantized_bytes(chunk_, 8);
    at::Tensor send2 = torch::zeros({nodes * bytes2}, send1_.options());
    for (int m = 0; m < nodes; ++m)
      if (m != n)
        send2.narrow(0, m * bytes2, bytes2)
            .copy_(comm::quantize(partial_.narrow(0, m * chunk_, chunk_), 8));
    at::Tensor recv2 = torch::empty_like(send2);
    hops_.inter->all_to_all(recv2, send2)->wait();
    at::Tensor sum = partial_.narrow(0, n * chunk_, chunk_);  // the node's exact partial
    for (int m = 0; m < nodes; ++m)
      if (m != n)
        comm::dequantize(recv2.narrow(0, m * bytes2, bytes2), sum, 8, comm::kQuantBlock,
                         /*add=*/true);
    output_.copy_(sum.narrow(0, 0, output_.numel()));
    send1_ = recv1_ = partial_ = at::Tensor();
  }

 private:
  comm::WorkPtr hop1_;
  QgzHops hops_;
  at::Tensor send1_, recv1_;  // hop 1's wire forms, L chunks of N segments each
  at::Tensor partial_;        // fp32 [N · chunk]: the node's sums of segments n'·L + l
  at::Tensor output_;
  int64_t chunk_;
};

// Nothing to move: every rank's splits are all zero.
class DoneWork : public comm::Work {
 public:
  void wait() override {}
};

}  // namespace

comm::WorkPtr quantized_reduce_scatter_v(comm::Communicator& comm, at::Tensor& output,
                                         const at::Tensor& input,
                                         const std::vector<int64_t>& splits, int bits) {
  const int world = comm.world_size(), rank = comm.rank();
  TORCH_CHECK(static_cast<int>(splits.size()) == world,
              "quantized_reduce_scatter_v: ", splits.size(), " splits for world size ", world);
  TORCH_CHECK(output.numel() == splits[rank], "quantized_reduce_scatter_v: output of ",
              output.numel(), " elements for a split of ", splits[rank]);
  const int64_t chunk = *std::max_element(splits.begin(), splits.end());
  if (chunk == 0) return std::make_shared<DoneWork>();
  const int64_t bytes = comm::quantized_bytes(chunk, bits);
  const at::Tensor flat = input.reshape({-1});
  at::Tensor send = torch::empty({world * bytes}, input.options().dtype(torch::kUInt8));
  at::Tensor sum = torch::zeros({chunk}, input.options().dtype(torch::kFloat));
  at::Tensor padded = torch::zeros({chunk}, input.options().dtype(torch::kFloat));
  int64_t offset = 0;
  for (int r = 0; r < world; ++r) {
    at::Tensor segment = flat.narrow(0, offset, splits[r]);
    offset += splits[r];
    if (r == rank) {
      sum.narrow(0, 0, splits[r]).copy_(segment);  // exact: it never crosses the wire
      send.narrow(0, r * bytes, bytes).zero_();    // the chunk to itself is not read
      continue;
    }
    padded.zero_();
    padded.narrow(0, 0, splits[r]).copy_(segment);
    send.narrow(0, r * bytes, bytes).copy_(comm::quantize(padded, bits));
  }
  at::Tensor recv = torch::empty_like(send);
  comm::WorkPtr inner = comm.all_to_all(recv, send);
  return std::make_shared<QuantizedReduceWork>(std::move(inner), send, recv, sum, output, rank,
                                               world, bits);
}

QgzHops make_qgz_hops(comm::Communicator& comm, int local_size) {
  const int world = comm.world_size();
  if (local_size <= 1 || local_size >= world || world % local_size != 0) return {};
  QgzHops h;
  h.intra = comm.split(/*color=*/comm.rank() / local_size, /*key=*/comm.rank());
  h.inter = comm.split(/*color=*/comm.rank() % local_size, /*key=*/comm.rank());
  return h;
}

comm::WorkPtr quantized_reduce_scatter_v(comm::Communicator& comm, const QgzHops& hops,
                                         at::Tensor& output, const at::Tensor& input,
                                         const std::vector<int64_t>& splits) {
  TORCH_CHECK(hops.two_hops(), "quantized_reduce_scatter_v: two hops without their groups");
  const int world = comm.world_size(), rank = comm.rank();
  const int local = hops.intra->world_size(), l = hops.intra->rank();
  const int nodes = hops.inter->world_size();
  TORCH_CHECK(static_cast<int>(splits.size()) == world && local * nodes == world,
              "quantized_reduce_scatter_v: ", splits.size(), " splits, ", nodes, " nodes of ",
              local, " ranks, world size ", world);
  TORCH_CHECK(output.numel() == splits[rank], "quantized_reduce_scatter_v: output of ",
              output.numel(), " elements for a split of ", splits[rank]);
  const int64_t chunk = *std::max_element(splits.begin(), splits.end());
  if (chunk == 0) return std::make_shared<DoneWork>();
  std::vector<int64_t> begin(world + 1, 0);
  for (int r = 0; r < world; ++r) begin[r + 1] = begin[r] + splits[r];
  const at::Tensor flat = input.reshape({-1});
  const auto f32 = input.options().dtype(torch::kFloat);
  // payload(p): segments n'·L + p for n' = 0..N-1, each padded to `chunk`, in fp32.
  auto payload = [&](int p, at::Tensor out) {
    out.zero_();
    for (int m = 0; m < nodes; ++m) {
      const int r = m * local + p;
      out.narrow(0, m * chunk, splits[r]).copy_(flat.narrow(0, begin[r], splits[r]));
    }
  };
  const int64_t bytes1 = comm::quantized_bytes(nodes * chunk, 4);
  at::Tensor send1 = torch::zeros({local * bytes1}, input.options().dtype(torch::kUInt8));
  at::Tensor partial = torch::empty({nodes * chunk}, f32);
  at::Tensor scratch = torch::empty({nodes * chunk}, f32);
  for (int p = 0; p < local; ++p) {
    if (p == l) {
      payload(p, partial);  // exact: it stays on this rank
      continue;
    }
    payload(p, scratch);
    send1.narrow(0, p * bytes1, bytes1).copy_(comm::quantize(scratch, 4));
  }
  at::Tensor recv1 = torch::empty_like(send1);
  comm::WorkPtr hop1 = hops.intra->all_to_all(recv1, send1);
  return std::make_shared<TwoHopWork>(std::move(hop1), hops, send1, recv1, partial, output, chunk);
}

}  // namespace zero
}  // namespace deepspeed
