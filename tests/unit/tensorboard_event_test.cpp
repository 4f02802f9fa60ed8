// The hand-written protobuf encoder of TensorBoard's Event records
// (src/monitor/tensorboard_event.h) against bytes derived by hand from the wire format, field by
// field: each expected string below is written as key byte | value bytes, the key being
// (field_number << 3) | wire_type:
//   Event:         09 wall_time (double, I64)   10 step (int64, varint)
//                  1a file_version (LEN)        2a summary (LEN)
//   Summary:       0a value (LEN)
//   Summary.Value: 0a tag (LEN)                 15 simple_value (float, I32)
// What protobuf itself makes of our files is checked by the independent Python reader
// (MonitorFormat.EventFileReadsBackWithPythonProtobuf in monitor_test.cpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "monitor/tensorboard_event.h"

namespace tensorboard_event_test {

namespace dm = deepspeed::monitor;

namespace {

// Lower-case hex of `bytes`, so a failure shows where the encodings part.
std::string hex(const std::string& bytes) {
  std::string out;
  char b[3];
  for (unsigned char c : bytes) {
    std::snprintf(b, sizeof b, "%02x", c);
    out += b;
  }
  return out;
}

// "0a 02 6c 72" -> "0a026c72": the expectations are written with a space between fields.
std::string packed(std::string spaced) {
  std::string out;
  for (char c : spaced)
    if (c != ' ') out.push_back(c);
  return out;
}

}  // namespace

TEST(TensorBoardEvent, FileVersionRecord) {
  // wall_time 1.5 = 0x3ff8000000000000, little-endian; step 0 left out (proto3 default);
  // file_version: 13 bytes of "brain.Event:2".
  EXPECT_EQ(hex(dm::encode_file_version_event(1.5, 0, "brain.Event:2")),
            packed("09 00000000 0000f83f "
                   "1a 0d 627261696e2e4576656e743a32"));
  // file_version is a oneof member: written when set even though empty; wall_time 0.0 left out.
  EXPECT_EQ(hex(dm::encode_file_version_event(0.0, 0, "")), packed("1a 00"));
}

TEST(TensorBoardEvent, ZeroValueIsWrittenZeroStepAndTimeAreNot) {
  // Value   = 0a 02 "lr" | 15 00000000        9 bytes: simple_value 0.0 is a oneof member, present
  // Summary = 0a 09 Value                    11 bytes
  // Event   = 2a 0b Summary                  wall_time 0.0 and step 0 left out
  EXPECT_EQ(hex(dm::encode_scalar_event(0.0, 0, "lr", 0.0f)),
            packed("2a 0b 0a 09 0a 02 6c72 15 00000000"));
}

TEST(TensorBoardEvent, NegativeStepAndEmptyTag) {
  // step -2 = 0xfffffffffffffffe as a varint: low 7 bits 1111110 -> fe, eight groups of 1s -> ff
  // each, the 64th bit -> 01 (a negative int64 is always 10 bytes).
  // Value   = 15 0000803f      1.0f = 0x3f800000; the empty tag left out (proto3 default)
  // Summary = 0a 05 Value      Event: wall_time 2.0 = 0x4000000000000000
  EXPECT_EQ(hex(dm::encode_scalar_event(2.0, -2, "", 1.0f)),
            packed("09 0000000000000040 "
                   "10 feffffffffffffffff01 "
                   "2a 07 0a 05 15 0000803f"));
  // -0.0 is not the default: protobuf compares the bits, so wall_time and value are written.
  // Value = 0a 01 "x" | 15 00000080 (8 bytes); Summary = 0a 08 Value (10 bytes).
  EXPECT_EQ(hex(dm::encode_scalar_event(-0.0, 1, "x", -0.0f)),
            packed("09 0000000000000080 10 01 2a 0a 0a 08 0a 01 78 15 00000080"));
}

TEST(TensorBoardEvent, LongTagHasTwoByteLengths) {
  // A 200-byte tag, step 300, -2.5f = 0xc0200000. Varints of 128..16383 take two bytes,
  // (n & 0x7f) | 0x80 then n >> 7:
  //   step 300 -> ac 02;  tag 200 -> c8 01;  Value 3 + 200 + 5 = 208 -> d0 01;
  //   Summary 3 + 208 = 211 -> d3 01.
  const std::string tag(200, 'a');
  EXPECT_EQ(hex(dm::encode_scalar_event(0.0, 300, tag, -2.5f)),
            packed("10 ac02 2a d301 0a d001 0a c801 ") + hex(tag) + packed("15 000020c0"));
}

}  // namespace tensorboard_event_test
