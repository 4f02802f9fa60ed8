#include "comm/quantize.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
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

float block_scale(const float* x, int64_t n, int qmax) {
  float m = 0.f;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m / static_cast<float>(qmax);
}

// Nearest integer (halves away from zero), clamped: branch-free, so the loops vectorise.
inline int32_t round_clamp(float v, int qmax) {
  v = v >= 0.f ? v + 0.5f : v - 0.5f;
  const int32_t q = static_cast<int32_t>(v);
  return std::min(std::max(q, -qmax), qmax);
}

}  // namespace

int64_t quantized_bytes(int64_t numel, int bits, int64_t block) {
  qmax_of(bits);
  check_block(bits, block);
  return payload_bytes(numel, bits) + 4 * blocks_of(numel, block);
}

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
    if (bits == 8) {
      int8_t* qb = reinterpret_cast<int8_t*>(q) + start;
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) qb[i] = static_cast<int8_t>(round_clamp(xb[i] * inv, qmax));
      continue;
    }
    uint8_t* qb = q + start / 2;
    const int64_t pairs = len / 2;
#pragma omp simd
    for (int64_t p = 0; p < pairs; ++p) {
      const int32_t lo = round_clamp(xb[2 * p] * inv, qmax) + 8;
      const int32_t hi = round_clamp(xb[2 * p + 1] * inv, qmax) + 8;
      qb[p] = static_cast<uint8_t>(lo | (hi << 4));
    }
    if (len % 2) qb[pairs] = static_cast<uint8_t>((round_clamp(xb[len - 1] * inv, qmax) + 8) | (8 << 4));
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
  const at::Tensor v = x.detach().reshape({-1}).to(torch::kCPU, torch::kFloat).contiguous();
  const int64_t n = v.numel();
  at::Tensor wire = torch::empty({quantized_bytes(n, bits, block)}, torch::kUInt8);
  uint8_t* base = wire.data_ptr<uint8_t>();
  quantize_blocks(v.data_ptr<float>(), n, bits, block, base,
                  reinterpret_cast<float*>(base + payload_bytes(n, bits)));
  return x.device().is_cpu() ? wire : wire.to(x.device());
}

void dequantize(const at::Tensor& wire, at::Tensor& out, int bits, int64_t block, bool add) {
  const int64_t n = out.numel();
  const at::Tensor w = wire.to(torch::kCPU).contiguous();
  if (w.scalar_type() != torch::kUInt8 || w.numel() != quantized_bytes(n, bits, block))
    throw std::invalid_argument("dequantize: wire form of " + std::to_string(w.numel()) +
                                " bytes for " + std::to_string(n) + " values of " +
                                std::to_string(bits) + " bits (expected " +
                                std::to_string(quantized_bytes(n, bits, block)) + " uint8)");
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
