#include "capture.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "spawn.h"

extern char** environ;

namespace deepspeed {
namespace launcher {
namespace {

using Clock = std::chrono::steady_clock;

// One running command: its process, its two pipes (-1 once closed) and where their bytes go.
struct Running {
  size_t index = 0;  // into the commands and results
  pid_t pid = -1;
  int fds[2] = {-1, -1};  // stdout, stderr
  Clock::time_point deadline;
};

Running start(const std::vector<std::string>& argv, size_t index, Clock::duration limit) {
  const PipedChild child =
      spawn_piped(RankCommand{resolve_program(argv.at(0)), argv, merge_environment(environ, {})});
  Running r;
  r.index = index;
  r.pid = child.pid;
  r.fds[0] = child.out_fd;
  r.fds[1] = child.err_fd;
  r.deadline = Clock::now() + limit;
  return r;
}

bool pipes_open(const Running& r) { return r.fds[0] >= 0 || r.fds[1] >= 0; }

void close_pipes(Running& r) {
  for (int& fd : r.fds)
    if (fd >= 0) {
      ::close(fd);
      fd = -1;
    }
}

// Waits for the process (its pipes are closed or it was killed) and stores its status.
void reap(Running& r, Captured& c) {
  close_pipes(r);
  while (::waitpid(r.pid, &c.status, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

std::vector<Captured> run_all_captured(const std::vector<std::vector<std::string>>& commands,
                                       Clock::duration limit, size_t at_once) {
  std::vector<Captured> results(commands.size());
  std::vector<Running> running;
  size_t next = 0;
  at_once = std::max<size_t>(at_once, 1);
  try {
    while (next < commands.size() || !running.empty()) {
      while (next < commands.size() && running.size() < at_once) {
        running.push_back(start(commands[next], next, limit));
        ++next;
      }
      // Kill those past their limit; poll the others until the earliest deadline.
      auto now = Clock::now();
      auto earliest = Clock::time_point::max();
      for (auto& r : running) {
        if (now >= r.deadline) {
          results[r.index].timed_out = true;
          ::killpg(r.pid, SIGKILL);
          close_pipes(r);
        } else {
          earliest = std::min(earliest, r.deadline);
        }
      }
      std::vector<pollfd> polled;
      std::vector<std::pair<size_t, int>> owner;  // (position in running, 0 stdout / 1 stderr)
      for (size_t k = 0; k < running.size(); ++k)
        for (int s = 0; s < 2; ++s)
          if (running[k].fds[s] >= 0) {
            polled.push_back({running[k].fds[s], POLLIN, 0});
            owner.emplace_back(k, s);
          }
      if (!polled.empty()) {
        auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(earliest - now);
        int ms = static_cast<int>(std::max<long long>(wait.count(), 0) + 1);
        if (::poll(polled.data(), polled.size(), ms) < 0 && errno != EINTR)
          throw LaunchError(std::string("poll: ") + ::strerror(errno));
        for (size_t p = 0; p < polled.size(); ++p) {
          if (!polled[p].revents) continue;
          Running& r = running[owner[p].first];
          int& fd = r.fds[owner[p].second];
          Captured& c = results[r.index];
          char buf[4096];
          ssize_t got = ::read(fd, buf, sizeof buf);
          if (got > 0) {
            (owner[p].second == 0 ? c.out : c.err).append(buf, got);
          } else if (got == 0 || errno != EINTR) {
            ::close(fd);
            fd = -1;
          }
        }
      }
      // Done: both pipes at end of file (or killed). Reap those, keep the rest.
      for (size_t k = running.size(); k-- > 0;)
        if (!pipes_open(running[k])) {
          reap(running[k], results[running[k].index]);
          running.erase(running.begin() + static_cast<long>(k));
        }
    }
  } catch (...) {
    for (auto& r : running) {
      ::killpg(r.pid, SIGKILL);
      Captured ignored;
      reap(r, ignored);
    }
    throw;
  }
  return results;
}

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

}  // namespace launcher
}  // namespace deepspeed
