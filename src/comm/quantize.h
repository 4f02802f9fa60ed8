// Block quantization for compressed collectives (ZeRO++ qwZ / qgZ): symmetric int8 or int4 with
// one fp32 scale per block, as DeepSpeed's quantizer kernels (Symmetric, `groups` blocks).
//
// A block of `block` consecutive elements (the last may be shorter) has scale s = max|x| / qmax
// (qmax = 127 for int8, 7 for int4; s = 0 for an all-zero block) and stores q = round(x / s)
// clamped to [-qmax, qmax], so dequantized values q * s are within s / 2 of x (the round-trip
// bound the tests assert). int4 packs two values per byte: element 2i in the low nibble, 2i + 1
// in the high one, each stored as q + 8 (0..15, 0 unused).
//
// The wire form is one uint8 tensor: the packed values (n bytes for int8, ceil(n / 2) for int4)
// followed by the block scales (4 bytes each, native byte order: every rank of a job shares it),
// so one collective carries both. Pure functions; thread-safe.
#pragma once
#include <cstdint>

#include <ATen/Tensor.h>

namespace deepspeed {
namespace comm {

// DeepSpeed's qwZ quantizer aims at groups of at most 8000 elements
// (CUDAQuantizer.target_group_size, "the optimal size is 4k, so we set the target to be below
// 8k"); both ZeRO++ quantizers here use this block size.
constexpr int64_t kQuantBlock = 8000;

// Bytes of the wire form of `numel` values. REQUIRES: bits is 4 or 8, block >= 1.
int64_t quantized_bytes(int64_t numel, int bits, int64_t block = kQuantBlock);

// Raw kernels over contiguous memory: `q` receives the packed values (int8: n bytes, int4:
// ceil(n / 2)), `scales` ceil(n / block) floats.
void quantize_blocks(const float* x, int64_t n, int bits, int64_t block, uint8_t* q, float* scales);
void dequantize_blocks(const uint8_t* q, const float* scales, int64_t n, int bits, int64_t block,
                       float* out);

// The wire form of `x` (any floating dtype, converted to fp32 first; flattened), on x's device:
// the kernels above on the CPU, quantize_by_tensor_ops on a GPU (no round trip through host
// memory, no host wait). The same bytes either way.
at::Tensor quantize(const at::Tensor& x, int bits, int64_t block = kQuantBlock);
// Decodes `wire` (quantized_bytes(out.numel(), bits, block) bytes) into `out` (contiguous, any
// floating dtype), on out's device. add = true adds the values to out instead (qgZ sums the
// received chunks).
void dequantize(const at::Tensor& wire, at::Tensor& out, int bits, int64_t block = kQuantBlock,
                bool add = false);
// The same two in tensor operations on the tensors' device (what a GPU runs; on the CPU the
// tests compare them with the kernels byte for byte). The wire goes to out's device first.
at::Tensor quantize_by_tensor_ops(const at::Tensor& x, int bits, int64_t block = kQuantBlock);
void dequantize_by_tensor_ops(const at::Tensor& wire, at::Tensor& out, int bits,
                              int64_t block = kQuantBlock, bool add = false);

}  // namespace comm
}  // namespace deepspeed
