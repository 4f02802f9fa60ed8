#include "job_signals.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "output_pump.h"
#include "spawn.h"

namespace deepspeed {
namespace launcher {
namespace {

// Signal handlers only write the signal number into this pipe; the poll loop does the work.
int g_wake_pipe[2] = {-1, -1};
// SIGHUP (the terminal or ssh session closed) and SIGQUIT must not kill dsrun outright: its ranks
// run in process groups of their own and would be left running.
constexpr int kHandled[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD};
constexpr int kNumHandled = sizeof kHandled / sizeof kHandled[0];

extern "C" void on_signal(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  (void)!::write(g_wake_pipe[1], &byte, 1);
  errno = saved;
}

}  // namespace

SignalScope::SignalScope() {
  static_assert(sizeof saved_ / sizeof saved_[0] == kNumHandled + 1, "kHandled and SIGPIPE");
  if (::pipe2(g_wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw LaunchError(std::string("pipe failed: ") + ::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_NOCLDSTOP;
  for (int i = 0; i < kNumHandled; ++i) {
    ::sigaction(kHandled[i], nullptr, &saved_[i]);
    // `nohup dsrun ... &`: a SIGHUP ignored on entry stays ignored, so the job outlives the
    // session (and the ranks inherit SIG_IGN: spawn.cpp does not reset SIGHUP).
    if (kHandled[i] == SIGHUP && saved_[i].sa_handler == SIG_IGN) continue;
    ::sigaction(kHandled[i], &sa, nullptr);
  }
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;  // a closed stdout must not kill the launcher (and orphan ranks)
  ::sigaction(SIGPIPE, &ign, &saved_[kNumHandled]);
  OutputSink::set_queued(true);
}

SignalScope::~SignalScope() {
  OutputSink::set_queued(false);  // with SIGPIPE still ignored
  // A stop signal that came after the supervisor's last look at the pipe must not be lost (the
  // next --max_restarts attempt has a pipe of its own): with the stop signals blocked, the
  // dispositions are put back and such a signal is raised again, to act as it would have
  // without dsrun's handler (by default: end dsrun, whose ranks are all gone by now).
  sigset_t stop, old;
  sigemptyset(&stop);
  for (int sig : kHandled)
    if (is_stop_signal(sig)) sigaddset(&stop, sig);
  ::sigprocmask(SIG_BLOCK, &stop, &old);
  for (int i = 0; i < kNumHandled; ++i) ::sigaction(kHandled[i], &saved_[i], nullptr);
  ::sigaction(SIGPIPE, &saved_[kNumHandled], nullptr);
  if (int sig = take_stop_signal()) ::raise(sig);  // pending until the mask is restored
  ::close(g_wake_pipe[0]);
  ::close(g_wake_pipe[1]);
  g_wake_pipe[0] = g_wake_pipe[1] = -1;
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
}

int wake_fd() { return g_wake_pipe[0]; }

bool is_stop_signal(int sig) { return sig != SIGCHLD; }

int take_stop_signal() {
  int first = 0;
  unsigned char buf[64];
  ssize_t n;
  while ((n = ::read(wake_fd(), buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < n; ++i)
      if (first == 0 && is_stop_signal(buf[i])) first = buf[i];
  return first;
}

int finish_output(double limit_s) {
  using Clock = std::chrono::steady_clock;
  const auto limit = std::chrono::microseconds(static_cast<long long>(std::max(0.0, limit_s) * 1e6));
  const auto deadline = Clock::now() + limit;
  // The first turn always writes what the outputs take at once, even with no time left.
  for (bool first = true; OutputSink::any_pending(); first = false) {
    int timeout_ms = -1;
    if (limit_s >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0 && !first) {
        OutputSink::discard_all();
        return take_stop_signal();
      }
      timeout_ms = static_cast<int>(std::max<long long>(0, left.count())) + 1;
    }
    std::vector<pollfd> fds = {{wake_fd(), POLLIN, 0}};
    OutputSink::add_polls(&fds);
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) continue;  // EINTR: a signal, read below
    if (int sig = take_stop_signal()) {
      OutputSink::discard_all();
      return sig;
    }
    OutputSink::write_polled(fds.data() + 1, fds.size() - 1);
  }
  // Nothing (more) to write: a signal that came after the supervisor's last poll is still news.
  return take_stop_signal();
}

const char* signal_name(int sig) {
  static const std::map<int, const char*> names = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"}};
  auto it = names.find(sig);
  return it == names.end() ? "unknown signal" : it->second;
}

void say(const std::string& msg) { OutputSink::of(2).add("dsrun: " + msg + "\n"); }

}  // namespace launcher
}  // namespace deepspeed
