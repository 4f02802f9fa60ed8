// The default all_gather_into: an all_gather into a flat temporary, copied into each rank's
// output on wait(). Correct on any backend at the cost of the temporary and one copy; Gloo
// overrides it (gloo_communicator.cpp) and receives in place.
#include "comm/all_gather_into.h"

#include <torch/torch.h>

#include <string>
#include <utility>

#include "comm/work.h"

namespace deepspeed {
namespace comm {

void check_all_gather_into(const Communicator& comm, const std::vector<at::Tensor>& outputs,
                           const at::Tensor& input) {
  const auto where = [&] {
    return "all_gather_into on rank " + std::to_string(comm.rank()) + " of " +
           std::to_string(comm.world_size()) + ": ";
  };
  if (static_cast<int>(outputs.size()) != comm.world_size())
    throw CommError(where() + std::to_string(outputs.size()) +
                    " outputs given, one per rank needed");
  for (size_t r = 0; r < outputs.size(); ++r) {
    if (outputs[r].numel() != input.numel() || outputs[r].scalar_type() != input.scalar_type())
      throw CommError(where() + "output " + std::to_string(r) + " (" +
                      std::to_string(outputs[r].numel()) + " elements) must have the input's " +
                      std::to_string(input.numel()) + " elements and dtype");
  }
}

WorkPtr Communicator::all_gather_into(const std::vector<at::Tensor>& outputs,
                                      const at::Tensor& input) {
  check_all_gather_into(*this, outputs, input);
  at::Tensor flat = input.contiguous().view({-1});
  at::Tensor gathered = at::empty({flat.numel() * world_size()}, flat.options());
  WorkPtr inner = all_gather(gathered, flat);
  // This rank's output is written now: the input may be that very tensor, and nothing else
  // reads the output before wait().
  at::Tensor own = outputs[rank()];
  if (own.data_ptr() != input.data_ptr()) own.copy_(flat.view(own.sizes()));
  const int rank = this->rank();
  return std::make_shared<ThenWork>(std::move(inner), [gathered, outputs, rank] {
    const int64_t n = gathered.numel() / static_cast<int64_t>(outputs.size());
    for (size_t r = 0; r < outputs.size(); ++r) {
      if (static_cast<int>(r) == rank) continue;  // holds the input already (see above)
      at::Tensor out = outputs[r];
      out.copy_(gathered.narrow(0, r * n, n).view(out.sizes()));
    }
  });
}

}  // namespace comm
}  // namespace deepspeed
