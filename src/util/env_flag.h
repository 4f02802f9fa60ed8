// The on/off environment variables (the communication layer's DS_SHM_ALLREDUCE,
// DS_GLOO_HIERARCHICAL and DS_COMMS_CHECK; util/host_allocator.h's DS_MALLOC_TUNING), read alike.
#pragma once
#include <string>

namespace deepspeed {
namespace util {

// `name`'s value: "1"/"true" on, "0"/"false" off, unset or empty `unset`. Any other value throws
// ConfigError: "environment variable NAME='value' must be 1/true (<on>) or 0/false (<off>)".
bool flag_from_env(const char* name, bool unset, const std::string& on, const std::string& off);
// The same rule for `value`, read by the caller (nullptr: unset).
bool flag_from_value(const char* name, const char* value, bool unset, const std::string& on,
                     const std::string& off);

}  // namespace util
}  // namespace deepspeed
