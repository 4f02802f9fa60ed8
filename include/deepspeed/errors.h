// Exception types. Every message names what is at fault: the config key path and value, the file,
// the rank and collective, so a user can act on it without reading the source.
#pragma once
#include <stdexcept>
#include <string>

namespace deepspeed {

// Base of every error this library throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad ds_config.json content or bad initialize() arguments. Message names the key path
// (e.g. "zero_optimization.stage"), the value found and what was expected.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A collective failed or timed out; message names the op, its size, the rank and the wait.
class CommError : public Error {
 public:
  using Error::Error;
};

// A checkpoint is missing, truncated, corrupted or does not match the job; names the file.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// File or device I/O failed (NVMe swap, disk full, short read); names the path.
class IOError : public Error {
 public:
  using Error::Error;
};

}  // namespace deepspeed
