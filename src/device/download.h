// A reduced gradient bucket on its way to host memory without stopping the host: on a GPU it is
// copied into page-locked memory on a download stream, and the host reads it once the copy's
// fence has passed. Into pageable memory the same copy would block the host until the GPU got
// there (at every bucket, in the middle of backward), which is why both gradient homes in host
// memory that may be pageable take their buckets through here: the swapped gradients
// (offload/grad_store.h) and ZeRO-Offload's partition without pin_memory
// (zero/host_grad_partition.h).
#pragma once
#include <functional>
#include <memory>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "device/transfer_stream.h"

namespace deepspeed {
namespace device {

// A reduced bucket's values in host memory, readable once `fence` has passed.
struct Download {
  at::Tensor host;
  std::shared_ptr<CopyFence> fence;
};
using Downloader = std::function<Download(const at::Tensor& reduced)>;

// Host tensors as they are (a passed fence); a GPU's into page-locked memory (libtorch's caching
// host allocator: bucket-sized, short-lived blocks that are reused at once) on a download stream
// that first waits for the compute stream, which produced them.
Downloader stream_downloader(c10::Device device);

}  // namespace device
}  // namespace deepspeed
