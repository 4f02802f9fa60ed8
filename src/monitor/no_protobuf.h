// Why a build has no TensorBoard writer, for the errors that refuse tensorboard.enabled: CMake
// turns protobuf off when it is missing, or when the libtorch built against (the torch wheel)
// ships protobuf headers that would shadow the system's (DS_PROTOBUF_SHADOWED).
#pragma once

namespace deepspeed {
namespace monitor {

#ifdef DS_PROTOBUF_SHADOWED
inline constexpr const char* kNoProtobufReason =
    "its libtorch ships protobuf headers that shadow the system's (the torch wheel's), so "
    "protobuf is off; build against a libtorch without them (the libtorch archive, or Debian's) "
    "and reconfigure";
#else
inline constexpr const char* kNoProtobufReason =
    "protobuf or its compiler was not found (install libprotobuf-dev and protobuf-compiler and "
    "reconfigure)";
#endif

}  // namespace monitor
}  // namespace deepspeed
