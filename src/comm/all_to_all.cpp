// The default all_to_all: every rank's whole input is all-gathered and each rank keeps the
// chunks addressed to it. Correct on any backend, world_size times the bytes of a real
// all-to-all; Gloo overrides it (gloo_communicator.cpp).
#include "comm/all_to_all.h"

#include <torch/torch.h>

#include <string>

#include "comm/work.h"

namespace deepspeed {
namespace comm {

int64_t check_all_to_all(const Communicator& comm, const at::Tensor& output,
                         const at::Tensor& input) {
  const int world = comm.world_size();
  if (input.numel() != output.numel() || input.numel() % world != 0 ||
      input.scalar_type() != output.scalar_type()) {
    throw CommError("all_to_all on rank " + std::to_string(comm.rank()) + " of " +
                    std::to_string(world) + ": input (" + std::to_string(input.numel()) +
                    " elements) and output (" + std::to_string(output.numel()) +
                    " elements) must have the same dtype and size, a multiple of the world size");
  }
  return input.numel() / world;
}

WorkPtr Communicator::all_to_all(at::Tensor& output, const at::Tensor& input) {
  check_all_to_all(*this, output, input);
  at::Tensor flat = input.contiguous().view({-1});
  at::Tensor gathered = at::empty({flat.numel() * world_size()}, flat.options());
  WorkPtr inner = all_gather(gathered, flat);
  const int rank = this->rank(), world = world_size();
  return std::make_shared<ThenWork>(std::move(inner), [gathered, output, rank, world]() mutable {
    // gathered: [sender][chunk j], j = destination. Keep [sender][rank].
    // reshape: `mine` is strided (one chunk per sender), and so may the output be.
    at::Tensor mine = gathered.view({world, world, -1}).select(1, rank);
    output.copy_(mine.reshape(output.sizes()));
  });
}

}  // namespace comm
}  // namespace deepspeed
