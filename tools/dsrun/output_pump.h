// How ranks' output reaches dsrun's own stdout/stderr without ever stopping the supervisor.
//
// LinePump: carries one child pipe (a rank's stdout or stderr), one whole line at a time, each
// prefixed with "[rank K] ", into the OutputSink of dsrun's stdout or stderr, and optionally
// copies the unprefixed line to the rank's log file.
// OutputSink: the lines waiting to be written to fd 1 or fd 2, in the order they were read.
//
// Why a queue: dsrun's stdout may be slower than a rank (a terminal, `| tee`, ssh). A blocking
// write there would hold the supervisor's poll loop, which must go on reaping ranks, stopping the
// job when one fails and answering signals. So while a supervisor runs (a SignalScope exists) a
// line is only queued, and the loop writes it when poll() says the fd has room, without blocking
// (see write_ready()). A sink holding
// more than kHighWater bytes is "backlogged": the loop stops reading the pipes that feed it until
// it drains, so a rank printing faster than dsrun's stdout takes blocks in its own write()
// (back-pressure) instead of growing dsrun's memory.
//
// Lines never interleave mid-line: each destination has one queue written in order, and when
// fd 1 and fd 2 are the same file (2>&1, one terminal) they share one queue.
//
// Not thread-safe: the supervisor's single poll() loop owns every pump and sink.
#pragma once
#include <poll.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace deepspeed {
namespace launcher {

// Writes all of data to fd, retrying on EINTR/EAGAIN (blocking). Returns false if fd is broken
// (EPIPE etc.). For files dsrun owns (logs) and output outside a supervisor's loop.
bool write_all(int fd, const char* data, size_t size);

class OutputSink {
 public:
  // Queued bytes past which the pipes feeding the sink are no longer read.
  static constexpr size_t kHighWater = 256 * 1024;

  // The sink of fd 1 or 2 (REQUIRES: fd is 1 or 2); the same object for both when they are the
  // same file.
  static OutputSink& of(int fd);

  // While on (a supervisor's loop runs), add() only queues; while off, add() writes at once,
  // blocking like any program. Turning it off writes out what is still queued.
  static void set_queued(bool on);

  // Appends one whole line (ending with '\n'). After the fd broke (reader gone: `| head`), lines
  // are dropped: a closed stdout must not stop the job.
  void add(const std::string& line);
  bool has_pending() const { return pending_.size() > sent_; }
  bool backlogged() const { return pending_.size() - sent_ > kHighWater; }

  // The loop's side: a POLLOUT entry for every sink with queued lines, and after poll(), a bounded
  // write to each one whose entry is ready (see write_ready()).
  static void add_polls(std::vector<pollfd>* fds);
  static void write_polled(const pollfd* entries, size_t count);
  static bool any_pending();
  // Drops everything queued (dsrun was told to stop while its output could not be written). A
  // line cut short is ended with '\n' now if the fd takes it at once, else before the next line.
  static void discard_all();

 private:
  // How write_ready() avoids blocking, chosen at its first call from what fd_ is.
  enum class WritePath {
    kUndecided,
    kPrivate,  // a pipe, FIFO or terminal: write() to nonblock_fd_, a descriptor of the same file
               // opened anew with O_NONBLOCK (a flag on fd_ itself would leak to the shell and
               // every other process sharing the terminal or pipe)
    kSend,     // a socket (sshd gives its sessions socketpairs): send(MSG_DONTWAIT)
    kPolled,   // anything else (a regular file), or the above when that failed (no /proc, no
               // permission to open the terminal again): PIPE_BUF bytes per write() after poll()
               // says there is room, which never blocks on a pipe but may on a terminal
  };

  explicit OutputSink(int fd) : fd_(fd) {}
  // Writes at most kWriteBudget bytes without blocking (see WritePath); what the fd does not take
  // stays queued.
  void write_ready();
  void choose_write_path();
  void flush_blocking();
  void consumed(size_t n);
  void discard();

  int fd_;
  WritePath path_ = WritePath::kUndecided;
  int nonblock_fd_ = -1;  // kPrivate's descriptor (close-on-exec, kept for dsrun's lifetime)
  bool broken_ = false;
  bool mid_line_ = false;      // the last byte written was not '\n' (a partial write)
  bool owe_newline_ = false;   // discard() cut a line: write '\n' before the next one
  std::string pending_;  // queued bytes; pending_[0, sent_) are already written
  size_t sent_ = 0;
};

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
  // Open and its sink not backlogged: the loop should poll the pipe for input.
  bool wants_input() const { return is_open() && !sink_->backlogged(); }

  // One read() (bounded work per wake-up, so one busy rank cannot hold the loop) and the
  // complete lines it finished. At EOF or a read error the pump closes itself (flushing a partial
  // last line); returns is_open().
  bool pump();
  // Reads what the pipe holds now, whatever the sink's backlog, but at most the pipe's capacity:
  // that is all a writer that has exited can have left in it (its children may write on).
  // Used when a rank is reaped, so its last words come before dsrun's verdict.
  void drain();
  // Flushes a partial last line (as a line of its own) and closes the pipe.
  void close_and_flush();
  // Called with each line (unprefixed, without '\n') after it is queued: the multi-node
  // launcher learns from pdsh's stderr which host failed.
  void set_observer(std::function<void(const std::string&)> observer) { observer_ = std::move(observer); }

 private:
  // One read() into pending_; returns the byte count, 0 at EOF/error (pipe closed), -1 if empty.
  long read_once();
  void emit_complete_lines();
  void emit_line(const char* data, size_t size);  // size excludes the '\n'

  int src_fd_;
  OutputSink* sink_;
  std::string prefix_;
  int log_fd_;
  std::string pending_;  // bytes after the last '\n' seen
  std::function<void(const std::string&)> observer_;
};

}  // namespace launcher
}  // namespace deepspeed
