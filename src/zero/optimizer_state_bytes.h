// Bytes held in a libtorch optimizer's per-parameter state (Adam/AdamW moments, SGD momentum,
// Adagrad's sum) and the 1-bit optimizers' extra buffers (optim/extra_state.h),
// read from the real tensor storages for the memory report.
#pragma once
#include <cstdint>

#include <torch/optim/optimizer.h>

namespace deepspeed {
namespace zero {

int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer);

}  // namespace zero
}  // namespace deepspeed
