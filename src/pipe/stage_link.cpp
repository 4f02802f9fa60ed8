// StageLink: activations and gradients between neighbouring stages (stage_link.h), the shape
// metadata message that lets the receiver of an activation allocate it, and the slicing over the
// tensor group (pipe_partitioned / grad_partitioned).
#include "pipe/stage_link.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace pipe {

namespace {

// Metadata message: [ndim, dtype, dims...] padded to a fixed length, so the receiver knows its
// size without a first message.
constexpr int64_t kMetaLen = 10;

void send_meta(comm::Communicator& c, const at::Tensor& t, int dst) {
  TORCH_CHECK(t.dim() <= kMetaLen - 2, "pipeline: activations of more than ", kMetaLen - 2,
              " dimensions are not supported, got ", t.sizes());
  at::Tensor meta = torch::zeros({kMetaLen}, torch::kLong);
  meta[0] = t.dim();
  meta[1] = static_cast<int64_t>(t.scalar_type());
  for (int64_t i = 0; i < t.dim(); ++i) meta[2 + i] = t.size(i);
  c.send(meta, dst)->wait();
}

void recv_meta(comm::Communicator& c, int src, std::vector<int64_t>& shape, at::ScalarType& dtype) {
  at::Tensor meta = torch::zeros({kMetaLen}, torch::kLong);
  c.recv(meta, src)->wait();
  const int64_t ndim = meta[0].item<int64_t>();
  dtype = static_cast<at::ScalarType>(meta[1].item<int64_t>());
  shape.clear();
  for (int64_t i = 0; i < ndim; ++i) shape.push_back(meta[2 + i].item<int64_t>());
}

// Elements of each of `parts` equal slices of n (the last padded with zeros), as DeepSpeed's
// PartitionedTensor cuts a flat tensor.
int64_t slice_numel(int64_t n, int parts) { return (n + parts - 1) / parts; }

}  // namespace

StageLink::StageLink(comm::CommunicatorPtr pipe, int stage, bool dynamic_shape,
                     LinkSlicing slicing)
    : pipe_(std::move(pipe)), stage_(stage), dynamic_shape_(dynamic_shape),
      slicing_(std::move(slicing)) {
  if (!slicing_.tensor_group || slicing_.tensor_group->world_size() == 1)
    slicing_.activations = slicing_.gradients = false;
}

void StageLink::send(at::Tensor t, int dst, bool sliced) {
  if (!sliced) {
    pipe_->send(t, dst)->wait();
    return;
  }
  const auto& group = *slicing_.tensor_group;
  const int64_t n = t.numel(), per = slice_numel(n, group.world_size());
  const int64_t begin = std::min(n, per * group.rank()), end = std::min(n, begin + per);
  at::Tensor slice = t.reshape({-1}).narrow(0, begin, end - begin);
  if (end - begin < per) {  // the padded last slice
    at::Tensor padded = torch::zeros({per}, t.options());
    padded.narrow(0, 0, end - begin).copy_(slice);
    slice = padded;
  }
  slice = slice.contiguous();
  pipe_->send(slice, dst)->wait();
}

void StageLink::recv(at::Tensor& out, int src, bool sliced) {
  if (!sliced) {
    pipe_->recv(out, src)->wait();
    return;
  }
  auto& group = *slicing_.tensor_group;
  const int64_t n = out.numel(), per = slice_numel(n, group.world_size());
  at::Tensor slice = torch::empty({per}, out.options());
  pipe_->recv(slice, src)->wait();
  if (per * group.world_size() == n) {  // straight into `out`
    at::Tensor flat = out.view({-1});
    group.all_gather(flat, slice)->wait();
    return;
  }
  at::Tensor whole = torch::empty({per * group.world_size()}, out.options());
  group.all_gather(whole, slice)->wait();
  out.view({-1}).copy_(whole.narrow(0, 0, n));
}

void StageLink::send_activation(const at::Tensor& output) {
  at::Tensor t = output.detach().contiguous();
  if (!sent_meta_ || dynamic_shape_) {
    send_meta(*pipe_, t, stage_ + 1);
    sent_meta_ = true;
    sent_shape_ = t.sizes().vec();
  } else if (t.sizes().vec() != sent_shape_) {
    // The next stage posts a buffer of the first activation's shape: a send of another shape
    // would fail there without saying why, or (NCCL) hang or land misaligned.
    throw Error("pipeline stage " + std::to_string(stage_) + ": an activation of shape " +
                c10::str(t.sizes()) + " after the first one's " + c10::str(at::IntArrayRef(sent_shape_)) +
                "; the shape travels once unless PipelineInitializeArgs.dynamic_shape is true. "
                "Set it for micro-batches of changing shape (a short last micro-batch of an "
                "epoch with dataloader_drop_last false, sequences of changing length)");
  }
  send(t, stage_ + 1, slicing_.activations);
}

at::Tensor StageLink::recv_activation(const c10::Device& device) {
  if (!have_recv_meta_ || dynamic_shape_) {
    recv_meta(*pipe_, stage_ - 1, recv_shape_, recv_dtype_);
    have_recv_meta_ = true;
  }
  at::Tensor t = torch::empty(recv_shape_, at::TensorOptions().dtype(recv_dtype_).device(device));
  recv(t, stage_ - 1, slicing_.activations);
  return t;
}

at::Tensor StageLink::recv_grad(const at::Tensor& output) {
  at::Tensor g = torch::empty_like(output, at::MemoryFormat::Contiguous);
  recv(g, stage_ + 1, slicing_.gradients);
  return g;
}

void StageLink::send_grad(const at::Tensor& grad) {
  send(grad.contiguous(), stage_ - 1, slicing_.gradients);
}

}  // namespace pipe
}  // namespace deepspeed
