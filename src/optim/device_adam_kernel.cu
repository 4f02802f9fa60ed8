// The GPU Adam/AdamW kernel (device_adam_kernel.h). Memory-bound: each thread updates four
// adjacent elements with 16-byte loads and stores of the fp32 buffers (8-byte for the 16-bit
// ones), grid-stride over the partition, one wave of blocks; the few elements before the first
// such aligned group and after the last are updated one by one in the same launch (partition
// segments start at any element). Compiled with --fmad=false (adam_math.h says why).
#include "optim/device_adam_kernel.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace deepspeed::optim {
namespace {

using detail::AdamConsts;

constexpr int kThreads = 256;

enum class HalfOut { None, BF16, FP16 };

template <GradFormat G>
__device__ __forceinline__ float widen(uint16_t bits) {
  if constexpr (G == GradFormat::BF16) return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  else return __half2float(__ushort_as_half(bits));
}

template <GradFormat G>
__device__ __forceinline__ float grad_at(const void* grad, int64_t i) {
  if constexpr (G == GradFormat::FP32) return static_cast<const float*>(grad)[i];
  else return widen<G>(static_cast<const uint16_t*>(grad)[i]);
}

// Elements i..i+3 (aligned: a 16-byte load of fp32, an 8-byte one of 16-bit values).
template <GradFormat G>
__device__ __forceinline__ float4 grad4_at(const void* grad, int64_t i) {
  if constexpr (G == GradFormat::FP32) {
    return *reinterpret_cast<const float4*>(static_cast<const float*>(grad) + i);
  } else {
    const uint2 h = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(grad) + i);
    return make_float4(widen<G>(h.x & 0xFFFFu), widen<G>(h.x >> 16), widen<G>(h.y & 0xFFFFu),
                       widen<G>(h.y >> 16));
  }
}

// The 16-bit rounding of p: c10::BFloat16(float) / c10::Half(float), both nearest-even.
template <HalfOut O>
__device__ __forceinline__ uint32_t narrow(float p) {
  if constexpr (O == HalfOut::BF16) return detail::float_to_bf16_bits(p);
  else return __half_as_ushort(__float2half_rn(p));
}

template <GradFormat G, HalfOut O>
__device__ __forceinline__ void update_one(const DeviceAdamBuffers& b, int64_t i,
                                           const AdamConsts& c) {
  float p = b.param[i], m = b.exp_avg[i], v = b.exp_avg_sq[i];
  detail::adam_update(grad_at<G>(b.grad, i), p, m, v, c);
  b.param[i] = p;
  b.exp_avg[i] = m;
  b.exp_avg_sq[i] = v;
  if constexpr (O != HalfOut::None) b.half[i] = static_cast<uint16_t>(narrow<O>(p));
}

template <GradFormat G, HalfOut O>
__device__ __forceinline__ void update_four(const DeviceAdamBuffers& b, int64_t i,
                                            const AdamConsts& c) {
  float4 p = *reinterpret_cast<const float4*>(b.param + i);
  float4 m = *reinterpret_cast<const float4*>(b.exp_avg + i);
  float4 v = *reinterpret_cast<const float4*>(b.exp_avg_sq + i);
  const float4 g = grad4_at<G>(b.grad, i);
  detail::adam_update(g.x, p.x, m.x, v.x, c);
  detail::adam_update(g.y, p.y, m.y, v.y, c);
  detail::adam_update(g.z, p.z, m.z, v.z, c);
  detail::adam_update(g.w, p.w, m.w, v.w, c);
  *reinterpret_cast<float4*>(b.param + i) = p;
  *reinterpret_cast<float4*>(b.exp_avg + i) = m;
  *reinterpret_cast<float4*>(b.exp_avg_sq + i) = v;
  if constexpr (O != HalfOut::None) {
    const uint2 h = make_uint2(narrow<O>(p.x) | (narrow<O>(p.y) << 16),
                               narrow<O>(p.z) | (narrow<O>(p.w) << 16));
    *reinterpret_cast<uint2*>(b.half + i) = h;
  }
}

// `quads` aligned groups of four start at element `head`; the elements before them and after
// them ("loose") are updated one per thread.
template <GradFormat G, HalfOut O>
__global__ void __launch_bounds__(kThreads)
    adam_kernel(DeviceAdamBuffers b, AdamConsts c, int64_t head, int64_t quads) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t q = first; q < quads; q += stride) update_four<G, O>(b, head + 4 * q, c);
  const int64_t tail = head + 4 * quads;
  const int64_t loose = head + (b.n - tail);
  for (int64_t j = first; j < loose; j += stride)
    update_one<G, O>(b, j < head ? j : tail + (j - head), c);
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The first element (0..3) from which every buffer allows 4-element accesses, or -1 when no
// element does (buffers offset from one another by a number of elements not a multiple of 4).
int64_t quad_head(const DeviceAdamBuffers& b) {
  const int64_t grad_size = b.grad_format == GradFormat::FP32 ? 4 : 2;
  for (int64_t h = 0; h < 4 && h < b.n; ++h) {
    if (aligned(b.param + h, 16) && aligned(b.exp_avg + h, 16) && aligned(b.exp_avg_sq + h, 16) &&
        aligned(static_cast<const char*>(b.grad) + h * grad_size, 4 * grad_size) &&
        (b.half == nullptr || aligned(b.half + h, 8)))
      return h;
  }
  return -1;
}

[[noreturn]] void fail(const char* what, cudaError_t e) {
  throw std::runtime_error(std::string("deepspeed.cpp's GPU Adam kernel: ") + what + ": " +
                           cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// How many blocks of this instantiation the current device runs at once: its multiprocessors
// times the blocks each holds with the kernel's registers (not 2048 / kThreads: with IEEE division
// and square root and no fused multiply-add a thread may need more than 32 registers, and a grid
// sized for 8 blocks per multiprocessor would then run a second, partly filled wave). Asked once
// per device and instantiation; the grid-stride loop makes any grid correct.
template <GradFormat G, HalfOut O>
int64_t resident_blocks() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int64_t> known[kMaxDevices] = {};
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) fail("reading the current device", e);
  if (device >= 0 && device < kMaxDevices) {
    if (const int64_t k = known[device].load(std::memory_order_relaxed); k > 0) return k;
  }
  int sms = 0, per_sm = 0;
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) fail("reading the device's multiprocessor count", e);
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, adam_kernel<G, O>, kThreads, 0);
  if (e != cudaSuccess || per_sm <= 0) {
    (void)cudaGetLastError();  // not sticky: the launch's own check must not see it
    per_sm = 2048 / kThreads;
  }
  const int64_t blocks = static_cast<int64_t>(sms) * per_sm;
  if (device >= 0 && device < kMaxDevices) known[device].store(blocks, std::memory_order_relaxed);
  return blocks;
}

template <GradFormat G, HalfOut O>
void launch_as(const DeviceAdamBuffers& b, const AdamConsts& c, int64_t head, int64_t quads,
               cudaStream_t stream) {
  const int64_t work = std::max(quads, head + (b.n - head - 4 * quads));
  // One wave: as many blocks as the device holds at once, fewer for a small partition.
  const int64_t blocks = std::min<int64_t>((work + kThreads - 1) / kThreads, resident_blocks<G, O>());
  adam_kernel<G, O><<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)), kThreads, 0, stream>>>(
      b, c, head, quads);
}

template <GradFormat G>
void launch_with_grads(const DeviceAdamBuffers& b, const AdamConsts& c, int64_t head,
                       int64_t quads, cudaStream_t stream) {
  if (b.half == nullptr) return launch_as<G, HalfOut::None>(b, c, head, quads, stream);
  if (b.half_kind == Half16Kind::BF16) return launch_as<G, HalfOut::BF16>(b, c, head, quads, stream);
  return launch_as<G, HalfOut::FP16>(b, c, head, quads, stream);
}

}  // namespace

void launch_device_adam(const DeviceAdamBuffers& b, const AdamConsts& c, void* stream_ptr) {
  if (b.n <= 0) return;
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  // The launch's check below reads the thread's last error, which an earlier, unrelated failure
  // may have left: named here as that, not blamed on this launch.
  if (const cudaError_t earlier = cudaGetLastError(); earlier != cudaSuccess)
    fail("an earlier CUDA error, found before the launch", earlier);
  int64_t head = quad_head(b), quads = 0;
  if (head < 0)
    head = 0;  // every element loose
  else
    quads = (b.n - head) / 4;
  switch (b.grad_format) {
    case GradFormat::FP32: launch_with_grads<GradFormat::FP32>(b, c, head, quads, stream); break;
    case GradFormat::BF16: launch_with_grads<GradFormat::BF16>(b, c, head, quads, stream); break;
    case GradFormat::FP16: launch_with_grads<GradFormat::FP16>(b, c, head, quads, stream); break;
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail("launch failed", e);
}

}  // namespace deepspeed::optim
