#include "comm/quantize.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace deepspeed {
namespace comm {
namespace {

int qmax_of(int bits) {
  if (bits == 8) return 127;
  if (bits == 4) return 7;
  throw std::invalid_argument("quantize: " + std::to_string(bits) + " bits (4 or 8 supported)");
}

void check_block(int bits, int64_t block) {
  // int4: a block starts on a byte, so no byte holds values of two blocks.
  if (block < 1 || (bits == 4 && block % 2 != 0))
    throw std::invalid_argument("quantize: block of " + std::to_string(block) + " elements (" +
                                std::to_string(bits) + " bits needs a positive" +
                                (bits == 4 ? ", even" : "") + " block)");
}

// Values, padded to 4 bytes so the scales after them are aligned floats (also inside a gathered
// buffer of several ranks' wire forms laid end to end).
int64_t payload_bytes(int64_t n, int bits) {
  const int64_t packed = bits == 8 ? n : (n + 1) / 2;
  return (packed + 3) / 4 * 4;
}

int64_t blocks_of(int64_t n, int64_t block) { return (n + block - 1) / block; }

// max|x| / qmax, and NaN if the block holds a NaN (std::max would skip it), as the tensor
// operations' amax gives: the whole block then dequantizes to NaN, so an overflow in a quantized
// gradient still reaches fp16's overflow vote. An inf gives an inf scale: NaN after dequantizing.
float block_scale(const float* x, int64_t n, int qmax) {
  float m = 0.f;
  int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
  for (int64_t i = 0; i < n; ++i) {
    m = std::max(m, std::fabs(x[i]));
    nan |= x[i] != x[i];
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m / static_cast<float>(qmax);
}

// Nearest integer (halves away from zero), clamped: branch-free, so the loops vectorise. Clamped
// as a float, before the cast, which is undefined for what does not fit an int32 (a NaN, a non-
// finite block's values times a zero reciprocal, becomes 0).
inline int32_t round_clamp(float v, int qmax) {
  v = v == v ? v : 0.f;
  v = v >= 0.f ? v + 0.5f : v - 0.5f;
  const float limit = static_cast<float>(qmax);
  return static_cast<int32_t>(std::min(std::max(v, -limit), limit));
}

}  // namespace

int64_t quantized_bytes(int64_t numel, int bits, int64_t block) {
  qmax_of(bits);
  check_block(bits, block);
  return payload_bytes(numel, bits) + 4 * blocks_of(numel, block);
}

namespace {

// One block into its bytes; `scaled(x)` maps a value to quantization steps. A template, so each
// caller's loop vectorises with its own arithmetic and no per-element branch.
template <typename Scaled>
void quantize_block(const float* xb, int64_t len, int bits, int qmax, uint8_t* qb,
                    Scaled scaled) {
  if (bits == 8) {
    int8_t* out = reinterpret_cast<int8_t*>(qb);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) out[i] = static_cast<int8_t>(round_clamp(scaled(xb[i]), qmax));
    return;
  }
  const int64_t pairs = len / 2;
#pragma omp simd
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t lo = round_clamp(scaled(xb[2 * p]), qmax) + 8;
    const int32_t hi = round_clamp(scaled(xb[2 * p + 1]), qmax) + 8;
    qb[p] = static_cast<uint8_t>(lo | (hi << 4));
  }
  if (len % 2) qb[pairs] = static_cast<uint8_t>((round_clamp(scaled(xb[len - 1]), qmax) + 8) | (8 << 4));
}

}  // namespace

void quantize_blocks(const float* x, int64_t n, int bits, int64_t block, uint8_t* q,
                     float* scales) {
  const int qmax = qmax_of(bits);
  check_block(bits, block);
  for (int64_t b = 0, start = 0; start < n; ++b, start += block) {
    const int64_t len = std::min(block, n - start);
    const float* xb = x + start;
    const float s = block_scale(xb, len, qmax);
    scales[b] = s;
    const float inv = s > 0.f ? 1.f / s : 0.f;
    uint8_t* qb = bits == 8 ? q + start : q + start / 2;
    // A block whose max|x| < qmax * FLT_MIN (~1e-39 at 4 bits) has a subnormal scale whose
    // reciprocal overflows to inf: its values are divided by the scale instead.
    if (std::isinf(inv))
      quantize_block(xb, len, bits, qmax, qb, [s](float v) { return v / s; });
    else
      quantize_block(xb, len, bits, qmax, qb, [inv](float v) { return v * inv; });
  }
}

void dequantize_blocks(const uint8_t* q, const float* scales, int64_t n, int bits, int64_t block,
                       float* out) {
  qmax_of(bits);
  check_block(bits, block);
  for (int64_t b = 0, start = 0; start < n; ++b, start += block) {
    const int64_t len = std::min(block, n - start);
    const float s = scales[b];
    float* ob = out + start;
    if (bits == 8) {
      const int8_t* qb = reinterpret_cast<const int8_t*>(q) + start;
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) ob[i] = static_cast<float>(qb[i]) * s;
      continue;
    }
    const uint8_t* qb = q + start / 2;
    const int64_t pairs = len / 2;
#pragma omp simd
    for (int64_t p = 0; p < pairs; ++p) {
      ob[2 * p] = static_cast<float>((qb[p] & 15) - 8) * s;
      ob[2 * p + 1] = static_cast<float>((qb[p] >> 4) - 8) * s;
    }
    if (len % 2) ob[len - 1] = static_cast<float>((qb[pairs] & 15) - 8) * s;
  }
}

at::Tensor quantize(const at::Tensor& x, int bits, int64_t block) {
  if (!x.device().is_cpu()) return quantize_by_tensor_ops(x, bits, block);
  const at::Tensor v = x.detach().reshape({-1}).to(torch::kFloat).contiguous();
  const int64_t n = v.numel();
  at::Tensor wire = torch::empty({quantized_bytes(n, bits, block)}, torch::kUInt8);
  uint8_t* base = wire.data_ptr<uint8_t>();
  const int64_t packed = bits == 8 ? n : (n + 1) / 2;
  std::fill(base + packed, base + payload_bytes(n, bits), uint8_t{0});  // the same bytes everywhere
  quantize_blocks(v.data_ptr<float>(), n, bits, block, base,
                  reinterpret_cast<float*>(base + payload_bytes(n, bits)));
  return wire;
}

namespace {

void check_wire(const at::Tensor& w, int64_t n, int bits, int64_t block) {
  if (w.scalar_type() != torch::kUInt8 || w.numel() != quantized_bytes(n, bits, block))
    throw std::invalid_argument("dequantize: wire form of " + std::to_string(w.numel()) +
                                " bytes for " + std::to_string(n) + " values of " +
                                std::to_string(bits) + " bits (expected " +
                                std::to_string(quantized_bytes(n, bits, block)) + " uint8)");
}

}  // namespace

// The kernels' arithmetic in tensor operations, step for step: scale = max|x| / qmax and its
// reciprocal as true divisions by tensors (a division by a scalar may become a multiplication by
// its reciprocal), x * inv, +-0.5, truncation, clamp: the same IEEE float operations, so the
// same bytes on any device.
at::Tensor quantize_by_tensor_ops(const at::Tensor& x, int bits, int64_t block) {
  const int qmax = qmax_of(bits);
  check_block(bits, block);
  const at::Tensor v = x.detach().reshape({-1}).to(torch::kFloat);
  const int64_t n = v.numel();
  const int64_t nb = blocks_of(n, block);
  at::Tensor blocks = torch::zeros({nb * block}, v.options());
  blocks.narrow(0, 0, n).copy_(v);
  blocks = blocks.view({nb, block});
  at::Tensor scales = blocks.abs().amax({1}) / torch::full({nb}, static_cast<float>(qmax), v.options());
  at::Tensor inv = torch::where(scales > 0, torch::ones_like(scales) / scales, torch::zeros_like(scales));
  at::Tensor q = torch::where(inv.isinf().unsqueeze(1), blocks / scales.unsqueeze(1),
                              blocks * inv.unsqueeze(1));  // a subnormal scale: as the kernels
  q.add_(q.sign().mul_(0.5f)).trunc_();  // +-0.5 then truncation (a zero stays zero either way)
  // A NaN (a non-finite block) becomes 0, as in round_clamp.
  q = q.clamp_(-qmax, qmax).nan_to_num_(0.0).reshape({-1}).narrow(0, 0, n).to(torch::kInt);
  at::Tensor wire = torch::zeros({quantized_bytes(n, bits, block)}, v.options().dtype(torch::kUInt8));
  if (bits == 8) {
    wire.narrow(0, 0, n).copy_(q.to(torch::kChar).view(torch::kUInt8));
  } else {
    at::Tensor nibbles = torch::full({(n + 1) / 2 * 2}, 8, q.options());  // an odd tail pairs with 8
    nibbles.narrow(0, 0, n).add_(q);
    at::Tensor pairs = nibbles.view({-1, 2});
    at::Tensor bytes = pairs.select(1, 0).bitwise_or(pairs.select(1, 1) * 16);
    wire.narrow(0, 0, bytes.numel()).copy_(bytes.to(torch::kUInt8));
  }
  wire.narrow(0, payload_bytes(n, bits), 4 * nb).view(torch::kFloat).copy_(scales);
  return wire;
}

void dequantize_by_tensor_ops(const at::Tensor& wire, at::Tensor& out, int bits, int64_t block,
                              bool add) {
  qmax_of(bits);
  check_block(bits, block);
  const int64_t n = out.numel();
  const at::Tensor w = wire.to(out.device()).contiguous();
  check_wire(w, n, bits, block);
  const int64_t nb = blocks_of(n, block);
  at::Tensor q;
  if (bits == 8) {
    q = w.narrow(0, 0, n).view(torch::kChar).to(torch::kFloat);
  } else {
    at::Tensor bytes = w.narrow(0, 0, (n + 1) / 2).to(torch::kInt);
    at::Tensor lo = bytes.bitwise_and(15) - 8, hi = torch::div(bytes, 16, "floor") - 8;
    q = torch::stack({lo, hi}, 1).reshape({-1}).narrow(0, 0, n).to(torch::kFloat);
  }
  at::Tensor scales = w.narrow(0, payload_bytes(n, bits), 4 * nb).view(torch::kFloat);
  at::Tensor values =
      q * scales.unsqueeze(1).expand({nb, block}).reshape({-1}).narrow(0, 0, n);
  at::Tensor flat = out.view({-1});
  if (add)
    flat.add_(values);
  else
    flat.copy_(values);
}

void dequantize(const at::Tensor& wire, at::Tensor& out, int bits, int64_t block, bool add) {
  if (!out.is_cpu()) return dequantize_by_tensor_ops(wire, out, bits, block, add);
  const int64_t n = out.numel();
  const at::Tensor w = wire.to(torch::kCPU).contiguous();
  check_wire(w, n, bits, block);
  const bool direct = !add && out.is_cpu() && out.scalar_type() == torch::kFloat &&
                      out.is_contiguous();
  at::Tensor values = direct ? out : torch::empty({n}, torch::kFloat);
  const uint8_t* base = w.data_ptr<uint8_t>();
  dequantize_blocks(base, reinterpret_cast<const float*>(base + payload_bytes(n, bits)), n, bits,
                    block, values.data_ptr<float>());
  if (direct) return;
  at::Tensor flat = out.view({-1});
  if (add)
    flat.add_(values.to(out.device()));
  else
    flat.copy_(values);
}

}  // namespace comm
}  // namespace deepspeed
