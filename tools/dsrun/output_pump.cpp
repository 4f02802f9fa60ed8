#include "output_pump.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

namespace deepspeed {
namespace launcher {
namespace {

// A child that never prints '\n' must not grow dsrun's memory without bound: past this size the
// pending bytes are written out as a line of their own.
constexpr size_t kMaxLineBytes = 64 * 1024;

}  // namespace

bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n >= 0) {
      data += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      // Someone left our stdout non-blocking (shared terminal); wait until it drains.
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
      continue;
    }
    return false;
  }
  return true;
}

LinePump::LinePump(int src_fd, int dst_fd, std::string prefix, int log_fd)
    : src_fd_(src_fd), dst_fd_(dst_fd), prefix_(std::move(prefix)), log_fd_(log_fd) {
  int flags = ::fcntl(src_fd_, F_GETFL);
  ::fcntl(src_fd_, F_SETFL, flags | O_NONBLOCK);
}

LinePump::~LinePump() { close_and_flush(); }

bool LinePump::pump() {
  if (src_fd_ < 0) return false;
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(src_fd_, buf, sizeof buf);
    if (n > 0) {
      pending_.append(buf, static_cast<size_t>(n));
      emit_complete_lines();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    close_and_flush();  // EOF, or an error that leaves nothing more to read
    return false;
  }
}

void LinePump::close_and_flush() {
  if (src_fd_ < 0) return;
  if (!pending_.empty()) {
    emit_line(pending_.data(), pending_.size());
    pending_.clear();
  }
  ::close(src_fd_);
  src_fd_ = -1;
}

void LinePump::emit_complete_lines() {
  size_t start = 0;
  for (;;) {
    size_t nl = pending_.find('\n', start);
    if (nl == std::string::npos) break;
    emit_line(pending_.data() + start, nl - start);
    start = nl + 1;
  }
  pending_.erase(0, start);
  if (pending_.size() >= kMaxLineBytes) {
    emit_line(pending_.data(), pending_.size());
    pending_.clear();
  }
}

void LinePump::emit_line(const char* data, size_t size) {
  std::string line;
  line.reserve(prefix_.size() + size + 1);
  line.append(prefix_).append(data, size).push_back('\n');
  // A closed stdout (`dsrun ... | head`) must not stop the job: drop output, keep draining.
  if (!dst_broken_) dst_broken_ = !write_all(dst_fd_, line.data(), line.size());
  if (log_fd_ >= 0) write_all(log_fd_, line.data() + prefix_.size(), size + 1);
  if (observer_) observer_(std::string(data, size));
}

}  // namespace launcher
}  // namespace deepspeed
