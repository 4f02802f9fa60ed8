// LinePump: carries one child pipe (a rank's stdout or stderr) to dsrun's own stdout/stderr, one
// whole line at a time, each prefixed with "[rank K] ", and optionally copies the unprefixed line
// to the rank's log file.
//
// Whole lines are the unit because several ranks share one terminal: a line is written with a
// single write() call, so lines of different ranks never interleave mid-line.
//
// Not thread-safe: the supervisor's single poll() loop owns every pump.
#pragma once
#include <cstddef>
#include <functional>
#include <string>

namespace deepspeed {
namespace launcher {

// Writes all of data to fd, retrying on EINTR/EAGAIN. Returns false if fd is broken (EPIPE etc.).
bool write_all(int fd, const char* data, size_t size);

class LinePump {
 public:
  // src_fd: read end of the child's pipe (made non-blocking; the pump closes it).
  // dst_fd: where prefixed lines go (1 or 2). log_fd: -1 or a file owned by the caller.
  LinePump(int src_fd, int dst_fd, std::string prefix, int log_fd);
  ~LinePump();
  LinePump(const LinePump&) = delete;
  LinePump& operator=(const LinePump&) = delete;

  int fd() const { return src_fd_; }
  bool is_open() const { return src_fd_ >= 0; }

  // Reads everything available without blocking and writes out each complete line.
  // At EOF or a read error the pump closes itself (flushing a partial last line); returns
  // is_open().
  bool pump();
  // Flushes a partial last line (as a line of its own) and closes the pipe.
  void close_and_flush();
  // Called with each line (unprefixed, without '\n') after it is written out: the multi-node
  // launcher learns from pdsh's stderr which host failed.
  void set_observer(std::function<void(const std::string&)> observer) { observer_ = std::move(observer); }

 private:
  void emit_complete_lines();
  void emit_line(const char* data, size_t size);  // size excludes the '\n'

  int src_fd_;
  int dst_fd_;
  std::string prefix_;
  int log_fd_;
  bool dst_broken_ = false;
  std::string pending_;  // bytes after the last '\n' seen
  std::function<void(const std::string&)> observer_;
};

}  // namespace launcher
}  // namespace deepspeed
