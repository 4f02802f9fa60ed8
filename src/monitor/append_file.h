// Appending a buffer to a file with one write() per call where possible: what a monitor has
// handed to the kernel survives the process being killed (SIGKILL) right after.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace monitor {

// Opens `path` for appending (created if missing); throws Error naming the path.
inline int open_for_append(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("monitor: cannot open '" + path + "' for writing: " + std::strerror(errno));
  return fd;
}

// Writes all of `data` to `fd`; throws Error naming `path` on failure.
inline void write_all(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error("monitor: cannot write '" + path + "': " + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

}  // namespace monitor
}  // namespace deepspeed
