#include "zero/frozen_parameters.h"

#include <unordered_set>

#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {

MemoryReport FrozenParametersStage::memory() const {
  MemoryReport r = ForwardingStage::memory();
  std::unordered_set<const void*> seen;  // views of one storage count it once
  for (const auto& p : frozen_) {
    if (!p.defined() || !seen.insert(p.storage().unsafeGetStorageImpl()).second) continue;
    const int64_t bytes = storage_bytes(p);
    r.parameters += bytes;
    if (p.is_cpu()) r.host_bytes += bytes;
  }
  return r;
}

std::unique_ptr<ZeroStage> counting_frozen_parameters(std::unique_ptr<ZeroStage> inner,
                                                      std::vector<at::Tensor> frozen) {
  if (frozen.empty()) return inner;
  return std::make_unique<FrozenParametersStage>(std::move(inner), std::move(frozen));
}

}  // namespace zero
}  // namespace deepspeed
