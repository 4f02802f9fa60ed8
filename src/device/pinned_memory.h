// Host buffers for ZeRO-Offload and ZeRO-Infinity, page-locked when `pin` (pin_memory) and a GPU
// is there, of exactly the size asked.
//
// Why not at::empty(..., pinned_memory(true)): libtorch's caching host allocator rounds every
// request up to a power of two (libtorch 2.x, ATen/core/CachingHostAllocator.h) and keeps the
// block cached. For the offload's few, large, long-lived buffers that wastes up to half of what is
// page-locked: a 1.31B model's fp32 masters (5.2 GB) would take 8 GiB, and 7.9B's (31.6 GB)
// 32 GiB. Here the memory is allocated page-aligned and registered with the driver
// (cudaHostRegister): copies from and to it are asynchronous like any pinned memory's, and the
// page-locked bytes are the bytes asked (rounded to the page).
#pragma once
#include <cstdint>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

namespace deepspeed {
namespace device {

// An uninitialised 1-D host tensor of `numel` elements for copies to and from `device`.
// Page-locked when `pin` and `device` is a GPU, pageable otherwise. The registration runs with
// `device` current and is portable: a rank whose GPU is not device 0 neither creates a context on
// device 0 nor gets memory that only device 0's context counts as pinned. Throws
// deepspeed::Error naming the bytes and pin_memory when the driver refuses to page-lock them (the
// memlock limit, or not enough memory).
at::Tensor host_buffer(int64_t numel, at::ScalarType dtype, bool pin, c10::Device device);

}  // namespace device
}  // namespace deepspeed
