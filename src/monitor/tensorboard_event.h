// The tensorboard.Event records of an event file, encoded by hand in protobuf's wire format: the
// messages of src/monitor/proto/tensorboard_event.proto (a subset of TensorBoard's event.proto /
// summary.proto), byte for byte what protobuf's SerializeAsString gives for them. Hand-encoded so
// that the library needs no protobuf at all: the torch wheel ships protobuf headers of its own
// that shadow the system's, so generated code could not be compiled against it.
// Pure functions; thread-safe.
#pragma once
#include <cstdint>
#include <string>

namespace deepspeed {
namespace monitor {

// Event{wall_time, step, file_version}: the first record of a file ("brain.Event:2").
std::string encode_file_version_event(double wall_time, int64_t step, const std::string& version);

// Event{wall_time, step, summary{value{tag, simple_value}}}: one scalar.
std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag,
                                float simple_value);

}  // namespace monitor
}  // namespace deepspeed
