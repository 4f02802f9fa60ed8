#include "zero/stage3/quantized_gather.h"

#include <torch/torch.h>

#include "comm/quantize.h"
#include "device/transfer_stream.h"

namespace deepspeed {
namespace zero {
namespace {

constexpr int kBits = 8;  // DeepSpeed's qwZ: int8, symmetric

class QuantizedGatherWork : public comm::Work {
 public:
  QuantizedGatherWork(comm::WorkPtr inner, at::Tensor wire, at::Tensor wires, at::Tensor full,
                      int world)
      : inner_(std::move(inner)), wire_(std::move(wire)), wires_(std::move(wires)),
        full_(std::move(full)), world_(world) {}

  void wait() override {
    if (!inner_) return;
    inner_->wait();
    inner_.reset();
    const int64_t n = full_.numel() / world_;
    const int64_t bytes = wires_.numel() / world_;
    for (int r = 0; r < world_; ++r) {
      at::Tensor part = full_.narrow(0, r * n, n);
      comm::dequantize(wires_.narrow(0, r * bytes, bytes), part, kBits);
    }
    // Issued from a side stream (a unit fetched from host memory), the wire forms belong to its
    // pool, while the collective's end and the dequantize above are ordered on this stream: they
    // are freed only once this stream is past them, else the next fetch could reuse them early.
    device::hold_until_current_stream(wire_);
    device::hold_until_current_stream(wires_);
    wire_ = wires_ = at::Tensor();
  }

 private:
  comm::WorkPtr inner_;
  at::Tensor wire_;   // this rank's wire form, kept until the gather is done
  at::Tensor wires_;
  at::Tensor full_;
  int world_;
};

}  // namespace

int64_t quantized_gather_wire_bytes(int64_t slice_numel, int world_size) {
  return (world_size + 1) * comm::quantized_bytes(slice_numel, kBits);
}

comm::WorkPtr quantized_all_gather(comm::Communicator& comm, at::Tensor& full,
                                   const at::Tensor& slice) {
  const int world = comm.world_size();
  TORCH_CHECK(full.numel() == world * slice.numel(), "quantized_all_gather: output of ",
              full.numel(), " elements for ", world, " slices of ", slice.numel());
  at::Tensor wire = comm::quantize(slice, kBits);
  at::Tensor wires = torch::empty({world * wire.numel()}, wire.options());
  comm::WorkPtr inner = comm.all_gather(wires, wire);
  return std::make_shared<QuantizedGatherWork>(std::move(inner), wire, wires, full, world);
}

}  // namespace zero
}  // namespace deepspeed
