// What dsrun's two supervisors (launcher.cpp: the ranks of one node; multinode.cpp: one agent per
// node) share: signal handling through a self-pipe, signal names and dsrun's own messages.
#pragma once
#include <signal.h>

#include <string>

namespace deepspeed {
namespace launcher {

// Installs SIGINT/SIGTERM/SIGCHLD handlers that only write the signal number into a pipe (read
// it with wake_fd() in the poll loop), ignores SIGPIPE, and restores everything when destroyed.
// One at a time per process.
class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  struct sigaction saved_[4];
};

// Read end of the pipe (non-blocking); -1 outside a SignalScope.
int wake_fd();

// "SIGKILL" etc.; "unknown signal" for others.
const char* signal_name(int sig);

// Writes "dsrun: MSG\n" to stderr in one call (lines of different processes do not mix).
void say(const std::string& msg);

}  // namespace launcher
}  // namespace deepspeed
