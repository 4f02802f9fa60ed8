// The point-to-point traffic between neighbouring pipeline stages: activations forward to
// stage + 1, their gradients back to stage - 1, over the pipe group (numbered by stage).
// Separate from the schedule interpreter because it owns a small wire protocol of its own: the
// shape metadata that precedes an activation, without which the receiver cannot allocate its
// buffer. Each call is a blocking send or receive that the neighbour's schedule matches
// instruction for instruction; one StageLink per stage, used by the schedule's thread only.
#pragma once
#include <cstdint>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace pipe {

// With tensor parallelism inside the stages (pipeline.pipe_partitioned / grad_partitioned, on by
// default as DeepSpeed's), tensor rank t of a stage sends only slice t of each activation (or
// gradient) to tensor rank t of the neighbour, which all-gathers the slices over its tensor group:
// 1/tensor of the bytes between stages. Exact, because the activations leaving a stage and the
// gradients entering one are the same on every tensor rank of a stage (a row-parallel layer's
// all-reduce, a column-parallel layer's input-gradient all-reduce), as DeepSpeed assumes too.
struct LinkSlicing {
  comm::CommunicatorPtr tensor_group;  // null (or size 1): whole tensors
  bool activations = true;             // pipeline.pipe_partitioned
  bool gradients = true;               // pipeline.grad_partitioned
};

class StageLink {
 public:
  // `dynamic_shape`: send the metadata before every activation, not only the first
  // (PipelineInitializeArgs::dynamic_shape).
  StageLink(comm::CommunicatorPtr pipe, int stage, bool dynamic_shape, LinkSlicing slicing = {});

  // REQUIRES: a stage after this one, which calls recv_activation for it.
  void send_activation(const at::Tensor& output);
  // REQUIRES: a stage before this one. The received activation, on `device`.
  at::Tensor recv_activation(const c10::Device& device);
  // REQUIRES: a stage after this one. The gradient of `output` (sent earlier with
  // send_activation), shaped as it.
  at::Tensor recv_grad(const at::Tensor& output);
  // REQUIRES: a stage before this one, which calls recv_grad for it.
  void send_grad(const at::Tensor& grad);

 private:
  // Sends `t` whole, or this tensor rank's slice of it (`sliced`).
  void send(at::Tensor t, int dst, bool sliced);
  // Receives into `out` (contiguous, its final shape) whole, or this rank's slice and then the
  // tensor group's all-gather of the slices.
  void recv(at::Tensor& out, int src, bool sliced);

  comm::CommunicatorPtr pipe_;
  int stage_;
  bool dynamic_shape_;
  LinkSlicing slicing_;
  // Shape metadata: sent / received once unless dynamic_shape_.
  bool sent_meta_ = false;
  std::vector<int64_t> sent_shape_;  // without dynamic_shape_: every activation must keep it
  bool have_recv_meta_ = false;
  std::vector<int64_t> recv_shape_;
  at::ScalarType recv_dtype_ = at::kFloat;
};

}  // namespace pipe
}  // namespace deepspeed
