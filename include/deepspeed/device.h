// Where training runs: the CPU, or this rank's GPU.
//
// DeepSpeed trains on the accelerator it finds; here the same rule is "auto", and a program or a
// test can pin it. Precedence: an explicit request ("cpu", "cuda", "cuda:N"), else the environment
// variable DS_DEVICE, else cuda:(LOCAL_RANK mod visible GPUs) when this libtorch has CUDA and a GPU
// is visible, else the CPU.
#pragma once
#include <string>

#include <c10/core/Device.h>

namespace deepspeed {

// Whether this libtorch was built with CUDA and at least one GPU is visible.
bool cuda_available();
// Visible GPUs (0 without CUDA).
int cuda_device_count();

// The device for `requested` ("auto", "", "cpu", "cuda", "cuda:N") on the rank with this local
// rank. Throws ConfigError naming the value when it is not one of those, or asks for a GPU that
// this build or machine does not have.
c10::Device resolve_device(const std::string& requested, int local_rank);
// Makes a GPU `device` the calling thread's current one (DeepSpeed's torch.cuda.set_device(
// local_rank)), so that what libtorch and the driver do on "the current GPU" (a context, a
// stream, an unqualified allocation) happens on this rank's GPU, not on GPU 0. No-op for the CPU.
void use_device(c10::Device device);

}  // namespace deepspeed

namespace deepspeed {

// The caching allocator's figures for a GPU (all zero for the CPU or a build without CUDA):
// what tensors hold now and at most since the last reset, and what the allocator reserved.
struct DeviceMemory {
  int64_t allocated = 0;
  int64_t allocated_peak = 0;
  int64_t reserved_peak = 0;
  int64_t total = 0;  // the device's memory
};
DeviceMemory device_memory(c10::Device device);
void reset_device_memory_peaks(c10::Device device);
// Waits until the GPU has run all the work queued on the calling thread's current stream of
// `device` (the engine's compute stream, which joins its side streams' copies); no-op for the
// CPU. For timings that must not end with work still queued.
void synchronize_device(c10::Device device);
// Caps what the caching allocator may take on `device` at `bytes` (torch.cuda's
// set_per_process_memory_fraction): an allocation beyond it fails as an out-of-memory would.
// Throws ConfigError for a CPU device or a cap larger than the device.
void cap_device_memory(c10::Device device, int64_t bytes);

}  // namespace deepspeed
