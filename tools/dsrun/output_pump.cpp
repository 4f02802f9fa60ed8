#include "output_pump.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace deepspeed {
namespace launcher {
namespace {

// A child that never prints '\n' must not grow dsrun's memory without bound: past this size the
// pending bytes are written out as a line of their own.
constexpr size_t kMaxLineBytes = 64 * 1024;
// Bytes one write_ready() may write before the loop looks at its other work again.
constexpr size_t kWriteBudget = 64 * 1024;
// What drain() reads when the pipe's capacity cannot be asked (Linux's default capacity).
constexpr long kDefaultPipeBytes = 64 * 1024;

bool g_queued = false;  // OutputSink::set_queued()

bool same_file(int a, int b) {
  struct stat sa, sb;
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

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

// ---- OutputSink ----------------------------------------------------------------------------

OutputSink& OutputSink::of(int fd) {
  static OutputSink out(1), err(2);
  // dsrun's stdout and stderr do not change while it runs: one look decides.
  static const bool shared = same_file(1, 2);
  return fd == 2 && !shared ? err : out;
}

void OutputSink::set_queued(bool on) {
  g_queued = on;
  if (on) return;
  of(1).flush_blocking();
  of(2).flush_blocking();
}

void OutputSink::add(const std::string& line) {
  if (broken_) return;
  if (owe_newline_) pending_ += '\n';
  owe_newline_ = false;
  pending_ += line;
  if (!g_queued) flush_blocking();
}

void OutputSink::add_polls(std::vector<pollfd>* fds) {
  OutputSink& out = of(1);
  OutputSink& err = of(2);
  if (out.has_pending()) fds->push_back({out.fd_, POLLOUT, 0});
  if (&err != &out && err.has_pending()) fds->push_back({err.fd_, POLLOUT, 0});
}

void OutputSink::write_polled(const pollfd* entries, size_t count) {
  for (size_t i = 0; i < count; ++i)
    if (entries[i].revents) of(entries[i].fd).write_ready();
}

bool OutputSink::any_pending() { return of(1).has_pending() || of(2).has_pending(); }

void OutputSink::discard_all() {
  of(1).discard();
  if (&of(2) != &of(1)) of(2).discard();
}

void OutputSink::discard() {
  pending_.clear();
  sent_ = 0;
  if (!mid_line_ || broken_) return;
  // End the cut line now if that does not block; otherwise the next add() does.
  pending_ = "\n";
  write_ready();
  owe_newline_ = has_pending();
  pending_.clear();
  sent_ = 0;
}

namespace {

// Opening /proc/self/fd/N of a pseudo-terminal's master side opens /dev/ptmx: a new terminal,
// which nobody reads. Such an output keeps the polled path.
bool is_pty_master(int fd) {
  unsigned int n = 0;
  return ::ioctl(fd, TIOCGPTN, &n) == 0;
}

}  // namespace

void OutputSink::choose_write_path() {
  struct stat st;
  path_ = WritePath::kPolled;
  if (::fstat(fd_, &st) != 0) return;
  if (S_ISSOCK(st.st_mode)) {
    path_ = WritePath::kSend;
  } else if (S_ISFIFO(st.st_mode) || (::isatty(fd_) && !is_pty_master(fd_))) {
    // Not other character devices: opening one again may have effects (a tape rewinds).
    std::string self = "/proc/self/fd/" + std::to_string(fd_);
    nonblock_fd_ = ::open(self.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (nonblock_fd_ >= 0) path_ = WritePath::kPrivate;
  }
}

void OutputSink::write_ready() {
  if (path_ == WritePath::kUndecided) choose_write_path();
  size_t budget = kWriteBudget;
  while (has_pending() && budget > 0) {
    const char* data = pending_.data() + sent_;
    size_t n = std::min(pending_.size() - sent_, budget);
    ssize_t w;
    if (path_ == WritePath::kPrivate) {
      w = ::write(nonblock_fd_, data, n);
    } else if (path_ == WritePath::kSend) {
      w = ::send(fd_, data, n, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w < 0 && errno == ENOTSOCK) {
        path_ = WritePath::kPolled;
        continue;
      }
    } else {
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, 0) <= 0 || !(p.revents & (POLLOUT | POLLERR | POLLHUP | POLLNVAL))) return;
      w = ::write(fd_, data, std::min(n, static_cast<size_t>(PIPE_BUF)));
    }
    if (w > 0) {
      consumed(static_cast<size_t>(w));
      budget -= static_cast<size_t>(w);
    } else if (w < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      broken_ = true;  // EPIPE (reader gone), EIO (terminal hung up), ...: drop output from now on
      pending_.clear();
      sent_ = 0;
      return;
    }
  }
}

void OutputSink::flush_blocking() {
  if (!broken_ && has_pending()) {
    broken_ = !write_all(fd_, pending_.data() + sent_, pending_.size() - sent_);
    mid_line_ = false;
  }
  pending_.clear();
  sent_ = 0;
}

void OutputSink::consumed(size_t n) {
  mid_line_ = pending_[sent_ + n - 1] != '\n';
  sent_ += n;
  if (sent_ == pending_.size()) {
    pending_.clear();
    sent_ = 0;
  } else if (sent_ >= kWriteBudget && sent_ * 2 >= pending_.size()) {
    pending_.erase(0, sent_);  // compact now and then, not per write (that would be quadratic)
    sent_ = 0;
  }
}

// ---- LinePump ------------------------------------------------------------------------------

LinePump::LinePump(int src_fd, int dst_fd, std::string prefix, int log_fd)
    : src_fd_(src_fd), sink_(&OutputSink::of(dst_fd)), prefix_(std::move(prefix)), log_fd_(log_fd) {
  int flags = ::fcntl(src_fd_, F_GETFL);
  ::fcntl(src_fd_, F_SETFL, flags | O_NONBLOCK);
}

LinePump::~LinePump() { close_and_flush(); }

long LinePump::read_once() {
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(src_fd_, buf, sizeof buf);
    if (n > 0) {
      pending_.append(buf, static_cast<size_t>(n));
      emit_complete_lines();
      return n;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
    close_and_flush();  // EOF, or an error that leaves nothing more to read
    return 0;
  }
}

bool LinePump::pump() {
  if (src_fd_ >= 0) read_once();
  return is_open();
}

void LinePump::drain() {
  if (src_fd_ < 0) return;
  int capacity = ::fcntl(src_fd_, F_GETPIPE_SZ);
  for (long left = capacity > 0 ? capacity : kDefaultPipeBytes; left > 0;) {
    long n = read_once();
    if (n <= 0) return;
    left -= n;
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
  sink_->add(line);
  if (log_fd_ >= 0) write_all(log_fd_, line.data() + prefix_.size(), size + 1);
  if (observer_) observer_(std::string(data, size));
}

}  // namespace launcher
}  // namespace deepspeed
