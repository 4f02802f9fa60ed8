#include "zero/stage3/spare_buffers.h"

#include <ATen/ATen.h>

namespace deepspeed {
namespace zero {

at::Tensor SpareBuffers::take(int64_t numel, const at::TensorOptions& options) {
  if (!options.device().is_cpu()) return at::Tensor();
  const auto dtype = c10::typeMetaToScalarType(options.dtype());
  for (size_t i = 0; i < kept_.size(); ++i) {
    if (kept_[i].numel() != numel || kept_[i].scalar_type() != dtype) continue;
    at::Tensor t = std::move(kept_[i]);
    kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
    numel_ -= t.numel();
    bytes_ -= static_cast<int64_t>(t.nbytes());
    return t;
  }
  return at::Tensor();
}

bool SpareBuffers::worth_keeping(const at::Tensor& buffer) const {
  return buffer.defined() && buffer.device().is_cpu() && buffer.is_contiguous() &&
         static_cast<int64_t>(buffer.nbytes()) >= min_bytes_ &&
         buffer.storage_offset() == 0 && buffer.use_count() == 1 &&
         buffer.storage().use_count() == 1;
}

void SpareBuffers::keep(at::Tensor buffer) {
  numel_ += buffer.numel();
  bytes_ += static_cast<int64_t>(buffer.nbytes());
  kept_.push_back(std::move(buffer));
}

void SpareBuffers::shrink_to(int64_t numel) {
  while (numel_ > numel && !kept_.empty()) {
    numel_ -= kept_.front().numel();
    bytes_ -= static_cast<int64_t>(kept_.front().nbytes());
    kept_.erase(kept_.begin());
  }
}

}  // namespace zero
}  // namespace deepspeed
