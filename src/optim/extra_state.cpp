#include "optim/extra_state.h"

#include <torch/torch.h>

namespace deepspeed {
namespace optim {

at::Tensor concat_flat(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.detach().reshape(-1));
  return flat.empty() ? torch::zeros({0}, torch::kFloat) : torch::cat(flat);
}

void copy_from_flat(const at::Tensor& flat, const std::vector<at::Tensor>& dst,
                    const std::string& what) {
  int64_t total = 0;
  for (const auto& t : dst) total += t.numel();
  TORCH_CHECK(flat.dim() == 1 && flat.numel() == total, "saved ", what, " has ", flat.numel(),
              " elements, this optimizer's parameters have ", total);
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& t : dst) {
    t.view(-1).copy_(flat.narrow(0, offset, t.numel()));
    offset += t.numel();
  }
}

int64_t storage_bytes_of(const std::vector<at::Tensor>& tensors) {
  int64_t total = 0;
  for (const auto& t : tensors)
    if (t.defined()) total += static_cast<int64_t>(t.storage().nbytes());
  return total;
}

}  // namespace optim
}  // namespace deepspeed
