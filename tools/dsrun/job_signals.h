// What dsrun's two supervisors (launcher.cpp: the ranks of one node; multinode.cpp: one agent per
// node) share: signal handling through a self-pipe, signal names and dsrun's own messages.
#pragma once
#include <signal.h>

#include <string>

namespace deepspeed {
namespace launcher {

// Installs handlers for SIGCHLD and the stop signals (SIGINT, SIGTERM, SIGHUP: terminal or ssh
// closed, SIGQUIT) that only write the signal number into a pipe (read it with wake_fd() in the
// poll loop), ignores SIGPIPE, and queues output (OutputSink::set_queued) so that nothing the
// loop does blocks on dsrun's stdout/stderr. A SIGHUP ignored on entry (nohup) stays ignored.
// Restores everything when destroyed, writing out what is still queued first; a stop signal still
// unread on the pipe then is raised again under the restored disposition (by default it ends
// dsrun). One at a time per process.
class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  struct sigaction saved_[6];  // kHandled, then SIGPIPE
};

// Read end of the pipe (non-blocking); -1 outside a SignalScope.
int wake_fd();

// The signals that stop the job (forwarded to the ranks, no restart): SIGINT, SIGTERM, SIGHUP,
// SIGQUIT. Every other byte on the wake pipe is SIGCHLD.
bool is_stop_signal(int sig);

// Reads every byte waiting on the wake pipe; returns the first stop signal among them, 0 if none.
// REQUIRES: inside a SignalScope.
int take_stop_signal();

// The supervisor's last step: writes out the queued output, waiting for dsrun's stdout/stderr to
// take it, at most limit_s seconds (< 0: no limit; a job that was told to stop should not wait on
// a reader that stopped reading). Gives up, dropping the rest, at the limit, or when dsrun gets a
// stop signal meanwhile. Returns the stop signal dsrun got since the supervisor's loop last read
// the wake pipe (however late), 0 if none. REQUIRES: inside a SignalScope, the ranks gone.
int finish_output(double limit_s);

// "SIGKILL" etc.; "unknown signal" for others.
const char* signal_name(int sig);

// Writes "dsrun: MSG\n" to stderr as one line, after the ranks' stderr lines read before it
// (through OutputSink: queued while a supervisor's loop runs).
void say(const std::string& msg);

}  // namespace launcher
}  // namespace deepspeed
