#include "activation/rng_state.h"

#include <mutex>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>

namespace deepspeed {
namespace checkpointing {
namespace {

// The generator of a device: the CPU's, or a CUDA device's (through the context, so the CPU
// flavour of the library compiles this without CUDA headers; it is only asked for CUDA devices
// that tensors live on).
const at::Generator& generator_of(const c10::Device& device) {
  if (device.is_cpu()) return at::detail::getDefaultCPUGenerator();
  return at::globalContext().defaultGenerator(device);
}

std::vector<c10::Device> with_cpu(const std::vector<c10::Device>& devices) {
  std::vector<c10::Device> out{c10::Device(c10::kCPU)};
  for (const auto& d : devices) {
    if (d.is_cpu()) continue;
    // A CUDA tensor's device may carry no index only through a user's hand-built Device.
    c10::Device full = d.has_index() ? d : c10::Device(d.type(), 0);
    bool seen = false;
    for (const auto& o : out) seen = seen || o == full;
    if (!seen) out.push_back(full);
  }
  return out;
}

}  // namespace

RngState RngState::capture(const std::vector<c10::Device>& devices) {
  RngState s;
  for (const auto& d : with_cpu(devices)) {
    at::Generator gen = generator_of(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.states_.emplace_back(d, gen.get_state());
  }
  return s;
}

void RngState::restore() const {
  for (const auto& [device, state] : states_) {
    at::Generator gen = generator_of(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
}

RngStateScope::RngStateScope(const RngState& saved, const std::vector<c10::Device>& devices)
    : entry_(RngState::capture(devices)) {
  saved.restore();
}

RngStateScope::~RngStateScope() { entry_.restore(); }

}  // namespace checkpointing
}  // namespace deepspeed
