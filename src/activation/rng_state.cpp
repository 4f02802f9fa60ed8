#include "activation/rng_state.h"

#include <mutex>
#include <optional>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>

namespace deepspeed {
namespace checkpointing {
namespace {

// The generator of a device: the CPU's, or a CUDA device's (through the context, so the CPU
// flavour of the library compiles this without CUDA headers; it is only asked for CUDA devices
// on a machine with a GPU).
const at::Generator& generator_of(const c10::Device& device) {
  if (device.is_cpu()) return at::detail::getDefaultCPUGenerator();
  return at::globalContext().defaultGenerator(device);
}

// The current CUDA device, on a build and machine with a GPU. Asked through the CUDA hooks, so the
// CPU flavour compiles it without CUDA headers (and answers "no GPU"). Its generator's state is a
// seed and an offset held on the host: reading it runs nothing on the GPU, and touches no more
// than torch::manual_seed does on such a machine (it seeds every GPU's generator). PyTorch saves
// the current device only once CUDA is initialised, which misses a segment that is the first to
// use the GPU; DeepSpeed (get_accelerator().get_rng_state()) saves it always, and so does this.
std::optional<c10::Device> current_cuda_device() {
  const auto& hooks = at::detail::getCUDAHooks();
  if (!hooks.hasCUDA()) return std::nullopt;
  const auto index = static_cast<int64_t>(hooks.current_device());
  if (index < 0) return std::nullopt;
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

std::vector<c10::Device> with_cpu(std::vector<c10::Device> devices) {
  if (auto current = current_cuda_device()) devices.push_back(*current);
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

RngState::States states_of(const std::vector<c10::Device>& devices) {
  RngState::States states;
  for (const auto& d : devices) states.emplace_back(d, generator_state(d));
  return states;
}

}  // namespace

at::Tensor generator_state(const c10::Device& device) {
  at::Generator gen = generator_of(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(const c10::Device& device, const at::Tensor& state) {
  at::Generator gen = generator_of(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

RngState RngState::capture(const std::vector<c10::Device>& devices) {
  RngState s;
  s.states_ = states_of(with_cpu(devices));
  return s;
}

std::vector<c10::Device> RngState::devices() const {
  std::vector<c10::Device> out;
  for (const auto& entry : states_) out.push_back(entry.first);
  return out;
}

void RngState::restore() const {
  for (const auto& [device, state] : states_) set_generator_state(device, state);
}

RngStateScope::RngStateScope(const RngState& saved) {
  entry_.states_ = states_of(saved.devices());
  saved.restore();
}

RngStateScope::~RngStateScope() { entry_.restore(); }

}  // namespace checkpointing
}  // namespace deepspeed
