#include "device/download.h"

#include <ATen/ops/empty.h>

#include "device/out_of_memory.h"

namespace deepspeed {
namespace device {

Downloader stream_downloader(c10::Device device) {
  if (device.is_cpu())
    return [](const at::Tensor& reduced) {
      return Download{reduced, CopyFence::record(c10::kCPU)};
    };
  auto stream = std::make_shared<SideStream>(device);
  return [stream](const at::Tensor& reduced) {
    if (reduced.is_cpu()) return Download{reduced, CopyFence::record(c10::kCPU)};
    const at::Tensor flat = reduced.reshape({-1});
    // The caching host allocator's rounding up wastes little on these (unlike on the long-lived
    // buffers of pinned_memory.h), and it keeps a block until the copies using it are done.
    // Page-locked whatever pin_memory says: into pageable memory the copy would block the host.
    Download d;
    {
      AllocatingFor naming("a page-locked copy of a reduced gradient bucket", -1, flat.numel(),
                           flat.element_size());
      d.host = at::empty({flat.numel()}, flat.options().device(c10::kCPU).pinned_memory(true));
    }
    stream->follow_current();  // the reduction producing it is queued on the compute stream
    stream->reads(flat);
    stream->run([&] {
      d.host.copy_(flat, /*non_blocking=*/true);
      d.fence = stream->mark();
    });
    return d;
  };
}

}  // namespace device
}  // namespace deepspeed
