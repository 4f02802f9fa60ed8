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
      : inner_(std::move(inner)), send_(std::move(send)), recv_(std::move(recv)),
        sum_(std::move(sum)), output_(std::move(output)), rank_(rank), world_(world),
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
  TORCH_CHECK(static_cast<int>(splits.size()) == world, "quantized_reduce_scatter_v: ",
              splits.size(), " splits for world size ", world);
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
      send.narrow(0, r * bytes, bytes).zero_();     // the chunk to itself is not read
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

}  // namespace zero
}  // namespace deepspeed
