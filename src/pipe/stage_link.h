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

class StageLink {
 public:
  // `dynamic_shape`: send the metadata before every activation, not only the first
  // (PipelineInitializeArgs::dynamic_shape).
  StageLink(comm::CommunicatorPtr pipe, int stage, bool dynamic_shape);

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
  comm::CommunicatorPtr pipe_;
  int stage_;
  bool dynamic_shape_;
  // Shape metadata: sent / received once unless dynamic_shape_.
  bool sent_meta_ = false;
  std::vector<int64_t> sent_shape_;  // without dynamic_shape_: every activation must keep it
  bool have_recv_meta_ = false;
  std::vector<int64_t> recv_shape_;
  at::ScalarType recv_dtype_ = at::kFloat;
};

}  // namespace pipe
}  // namespace deepspeed
