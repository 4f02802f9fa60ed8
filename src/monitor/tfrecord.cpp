#include "monitor/tfrecord.h"

#include "checkpoint/checksum.h"

namespace deepspeed {
namespace monitor {
namespace {

constexpr uint32_t kMaskDelta = 0xa282ead8u;

void append_fixed(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = checkpoint::crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

void append_tfrecord(std::string& out, const std::string& data) {
  std::string header;
  append_fixed(header, data.size(), 8);
  out += header;
  append_fixed(out, masked_crc32c(header.data(), header.size()), 4);
  out += data;
  append_fixed(out, masked_crc32c(data.data(), data.size()), 4);
}

}  // namespace monitor
}  // namespace deepspeed
