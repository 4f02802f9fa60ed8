// Protobuf's wire format, for the three messages of tensorboard_event.proto only
// (https://protobuf.dev/programming-guides/encoding/). A field is a key varint,
// (field_number << 3) | wire_type, then its value:
//   wire type 0 (varint):  int64 as 7-bit groups, low first, high bit = "more follows"; a
//                          negative int64 is its two's complement uint64, so always 10 bytes
//   wire type 1 (I64):     double, 8 bytes little-endian
//   wire type 2 (LEN):     string or sub-message, its byte length as a varint, then the bytes
//   wire type 5 (I32):     float, 4 bytes little-endian
// What protobuf's serializer does and we repeat, so the bytes are identical: fields in
// field-number order; proto3 scalars without presence (wall_time, step, tag) left out at their
// default (0.0 meaning the all-zero bit pattern: -0.0 is written, as protobuf compares the bits);
// oneof members (file_version, summary, simple_value) written whenever set, defaults included.
#include "monitor/tensorboard_event.h"

#include <cstring>

namespace deepspeed {
namespace monitor {
namespace {

// Field keys: (field_number << 3) | wire_type.
constexpr uint8_t kEventWallTime = (1 << 3) | 1;     // 0x09 double
constexpr uint8_t kEventStep = (2 << 3) | 0;         // 0x10 int64
constexpr uint8_t kEventFileVersion = (3 << 3) | 2;  // 0x1a string
constexpr uint8_t kEventSummary = (5 << 3) | 2;      // 0x2a Summary
constexpr uint8_t kSummaryValue = (1 << 3) | 2;      // 0x0a Summary.Value
constexpr uint8_t kValueTag = (1 << 3) | 2;          // 0x0a string
constexpr uint8_t kValueSimpleValue = (2 << 3) | 5;  // 0x15 float

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_little_endian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_length_delimited(std::string& out, uint8_t key, const std::string& bytes) {
  out.push_back(static_cast<char>(key));
  put_varint(out, bytes.size());
  out += bytes;
}

// Event fields 1 and 2, each left out at its default.
std::string event_header(double wall_time, int64_t step) {
  std::string out;
  uint64_t bits;
  std::memcpy(&bits, &wall_time, sizeof bits);
  if (bits != 0) {
    out.push_back(static_cast<char>(kEventWallTime));
    put_little_endian(out, bits, 8);
  }
  if (step != 0) {
    out.push_back(static_cast<char>(kEventStep));
    put_varint(out, static_cast<uint64_t>(step));
  }
  return out;
}

}  // namespace

std::string encode_file_version_event(double wall_time, int64_t step, const std::string& version) {
  std::string out = event_header(wall_time, step);
  put_length_delimited(out, kEventFileVersion, version);  // a oneof member: even when empty
  return out;
}

std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag,
                                float simple_value) {
  std::string value;
  if (!tag.empty()) put_length_delimited(value, kValueTag, tag);
  uint32_t bits;
  std::memcpy(&bits, &simple_value, sizeof bits);
  value.push_back(static_cast<char>(kValueSimpleValue));  // a oneof member: even at 0.0
  put_little_endian(value, bits, 4);
  std::string summary;
  put_length_delimited(summary, kSummaryValue, value);
  std::string out = event_header(wall_time, step);
  put_length_delimited(out, kEventSummary, summary);
  return out;
}

}  // namespace monitor
}  // namespace deepspeed
