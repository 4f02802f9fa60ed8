#include "job_signals.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <map>

#include "output_pump.h"
#include "spawn.h"

namespace deepspeed {
namespace launcher {
namespace {

// Signal handlers only write the signal number into this pipe; the poll loop does the work.
int g_wake_pipe[2] = {-1, -1};
constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGCHLD};

extern "C" void on_signal(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  (void)!::write(g_wake_pipe[1], &byte, 1);
  errno = saved;
}

}  // namespace

SignalScope::SignalScope() {
  if (::pipe2(g_wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw LaunchError(std::string("pipe failed: ") + ::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_NOCLDSTOP;
  for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &sa, &saved_[i]);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;  // a closed stdout must not kill the launcher (and orphan ranks)
  ::sigaction(SIGPIPE, &ign, &saved_[3]);
}

SignalScope::~SignalScope() {
  for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &saved_[i], nullptr);
  ::sigaction(SIGPIPE, &saved_[3], nullptr);
  ::close(g_wake_pipe[0]);
  ::close(g_wake_pipe[1]);
  g_wake_pipe[0] = g_wake_pipe[1] = -1;
}

int wake_fd() { return g_wake_pipe[0]; }

const char* signal_name(int sig) {
  static const std::map<int, const char*> names = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"}};
  auto it = names.find(sig);
  return it == names.end() ? "unknown signal" : it->second;
}

void say(const std::string& msg) {
  std::string line = "dsrun: " + msg + "\n";
  write_all(2, line.data(), line.size());
}

}  // namespace launcher
}  // namespace deepspeed
