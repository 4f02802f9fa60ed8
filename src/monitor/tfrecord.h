// TFRecord framing, the container of TensorBoard event files (TensorFlow's
// core/lib/io/record_writer.cc). Each record is
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) |
//   data[length]                  | uint32 masked_crc32c(data)
// A reader checks both checksums, so a record torn by a crash is detected, not misread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace deepspeed {
namespace monitor {

// CRC-32C rotated right by 15 bits plus a constant: TensorFlow masks stored CRCs so that a CRC
// computed over data that itself contains CRCs stays well distributed.
uint32_t masked_crc32c(const void* data, size_t n);

// Appends one framed record holding `data` to `out`.
void append_tfrecord(std::string& out, const std::string& data);

}  // namespace monitor
}  // namespace deepspeed
