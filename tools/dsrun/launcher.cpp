#include "launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>

#include "comm/shm_name.h"
#include "job_signals.h"
#include "output_pump.h"
#include "spawn.h"

extern char** environ;

namespace deepspeed {
namespace launcher {
namespace {

using Clock = std::chrono::steady_clock;

// After the last rank is reaped, how long to keep reading pipes a rank's own children may still
// hold open (on failure paths those children are killed with their group, so EOF comes at once).
constexpr auto kDrainAfterExit = std::chrono::seconds(1);

struct Rank {
  int rank = 0;   // global rank
  int local = 0;  // rank on this node
  pid_t pid = -1;
  bool reaped = false;
  int status = 0;  // waitpid status, valid once reaped
  std::unique_ptr<LinePump> out, err;
  int log_fd = -1;

  bool failed() const { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }
  void drain() {
    if (out) out->drain();
    if (err) err->drain();
  }
};

std::string timestamp() {
  char buf[32];
  std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y%m%d%H%M%S", std::localtime(&now));
  return buf;
}

class Supervisor {
 public:
  explicit Supervisor(const LaunchOptions& options) : opt_(options) {}
  JobOutcome run();

 private:
  void prepare();  // checks that need no process; throws LaunchError
  RankCommand command_for(int rank) const;
  void start_ranks();
  void supervise();
  void finish();
  int poll_timeout_ms(Clock::time_point now) const;
  void handle_wakeups();
  void reap();
  void report_failure(const Rank& r);
  void begin_shutdown(int sig);
  void handle_stdin();
  std::string where(const Rank& r) const;
  void kill_survivors(const std::string& when);
  void remove_leftover_segments();
  int alive() const;
  bool pumps_open() const;

  const LaunchOptions& opt_;
  std::string program_path_;
  std::vector<Rank> ranks_;
  bool shutting_down_ = false;
  int shutdown_signal_ = 0;  // what begin_shutdown() sent
  bool killed_ = false;
  Clock::time_point kill_deadline_;
  bool draining_ = false;
  bool stdin_open_ = false;  // watched (--watch_stdin) and not yet at EOF
  Clock::time_point drain_deadline_;
  int exit_status_ = 0;
  bool interrupted_ = false;  // dsrun itself got a stop signal (no restart then)
};

JobOutcome Supervisor::run() {
  try {
    prepare();
  } catch (const LaunchError& e) {
    say(e.what());
    return {2, /*started=*/false, false};
  }
  try {
    SignalScope signals;
    try {
      start_ranks();
    } catch (const LaunchError& e) {
      say(e.what() + std::string("; stopping the ranks already started"));
      exit_status_ = 1;
      begin_shutdown(SIGTERM);
    }
    supervise();
    // Still inside the scope: the sweep's messages are queued like the rest, so a stuck stderr
    // holds dsrun at most as long as finish() allows.
    remove_leftover_segments();
    finish();
  } catch (const LaunchError& e) {
    say(e.what());
    return {1, true, interrupted_};  // ranks may still run: their segments are not leftovers yet
  }
  for (auto& r : ranks_)
    if (r.log_fd >= 0) ::close(r.log_fd);
  return {exit_status_, true, interrupted_};
}

void Supervisor::prepare() {
  program_path_ = resolve_program(opt_.command.at(0));
  if (opt_.check_port) check_port_free(opt_.master_addr, opt_.master_port);
  ranks_.resize(opt_.num_procs);
  for (int i = 0; i < opt_.num_procs; ++i) {
    ranks_[i].local = i;
    ranks_[i].rank = opt_.node.first_rank + i;
  }
  stdin_open_ = opt_.watch_stdin;
  if (opt_.log_dir.empty()) return;
  ::mkdir(opt_.log_dir.c_str(), 0777);  // one level, like DeepSpeed's os.makedirs(exist_ok)
  std::string stamp = timestamp();
  for (auto& r : ranks_) {
    std::string path = opt_.log_dir + "/" + stamp + "_rank" + std::to_string(r.rank) + ".log";
    r.log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (r.log_fd < 0)
      throw LaunchError("--enable_each_rank_log: cannot create " + path + ": " + ::strerror(errno));
  }
}

std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (int x : v) out += (out.empty() ? "" : ",") + std::to_string(x);
  return out;
}

RankCommand Supervisor::command_for(int local) const {
  const int n = opt_.num_procs;
  const NodeInfo& node = opt_.node;
  const std::string world = std::to_string(node.world_size > 0 ? node.world_size : n);
  const std::string node_rank = std::to_string(node.node_rank);
  // torchrun's names (LOCAL_WORLD_SIZE, GROUP_RANK) and DeepSpeed launch.py's (LOCAL_SIZE,
  // CROSS_RANK, CROSS_SIZE) side by side: programs written for either find what they expect.
  std::map<std::string, std::string> env = {{"RANK", std::to_string(node.first_rank + local)},
                                            {"LOCAL_RANK", std::to_string(local)},
                                            {"WORLD_SIZE", world},
                                            {"LOCAL_SIZE", std::to_string(n)},
                                            {"LOCAL_WORLD_SIZE", std::to_string(n)},
                                            {"NODE_RANK", node_rank},
                                            {"GROUP_RANK", node_rank},
                                            {"CROSS_RANK", node_rank},
                                            {"CROSS_SIZE", std::to_string(node.num_nodes)},
                                            {"DSRUN_RESTART_COUNT", std::to_string(opt_.restart_count)},
                                            {"MASTER_ADDR", opt_.master_addr},
                                            {"MASTER_PORT", std::to_string(opt_.master_port)}};
  // DeepSpeed's launch.py gives each node its slot ids (GPU ids) as the visible devices.
  if (!node.slots.empty()) env["CUDA_VISIBLE_DEVICES"] = join_ints(node.slots);
  // N ranks each running one OpenMP thread per core would oversubscribe the machine N times.
  if (std::getenv("OMP_NUM_THREADS") == nullptr)
    env["OMP_NUM_THREADS"] = std::to_string(std::max(1, available_cpus() / n));

  RankCommand cmd;
  cmd.path = program_path_;
  cmd.argv.push_back(opt_.command[0]);
  // DeepSpeed's launch.py puts --local_rank right after the script, before the user's arguments.
  if (opt_.append_local_rank) cmd.argv.push_back("--local_rank=" + std::to_string(local));
  cmd.argv.insert(cmd.argv.end(), opt_.command.begin() + 1, opt_.command.end());
  cmd.env = merge_environment(environ, env);
  return cmd;
}

void Supervisor::start_ranks() {
  for (auto& r : ranks_) {
    PipedChild child;
    try {
      child = spawn_piped(command_for(r.local));
    } catch (const LaunchError& e) {
      r.reaped = true;  // never started
      throw LaunchError("cannot start rank " + std::to_string(r.rank) + ": " + e.what());
    }
    r.pid = child.pid;
    std::string prefix = "[" + (opt_.node.host.empty() ? "" : opt_.node.host + " ") + "rank " +
                         std::to_string(r.rank) + "] ";
    r.out = std::make_unique<LinePump>(child.out_fd, 1, prefix, r.log_fd);
    r.err = std::make_unique<LinePump>(child.err_fd, 2, prefix, r.log_fd);
  }
}

int Supervisor::alive() const {
  return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(),
                                        [](const Rank& r) { return r.pid > 0 && !r.reaped; }));
}

bool Supervisor::pumps_open() const {
  for (const auto& r : ranks_)
    if ((r.out && r.out->is_open()) || (r.err && r.err->is_open())) return true;
  return false;
}

void Supervisor::supervise() {
  for (;;) {
    reap();
    Clock::time_point now = Clock::now();
    if (shutting_down_ && !killed_ && alive() > 0 && now >= kill_deadline_) {
      char grace[32];
      std::snprintf(grace, sizeof grace, "%g", opt_.kill_grace_s);
      kill_survivors(std::string(grace) + " s after " + signal_name(shutdown_signal_));
    }
    if (alive() == 0) {
      if (!draining_) {
        draining_ = true;
        drain_deadline_ = now + kDrainAfterExit;
        // The ranks are gone but a child of one may have ignored SIGTERM: no reason to wait.
        if (shutting_down_ && !killed_) kill_survivors("");
      }
      if (!pumps_open() || now >= drain_deadline_) break;
    }
    // Each turn does bounded work (one read per ready pipe, a bounded write per writable output),
    // so reaping, timers and signals are looked at again soon however much the ranks print.
    std::vector<pollfd> fds = {{wake_fd(), POLLIN, 0}};
    const bool watch_stdin = stdin_open_;
    if (watch_stdin) fds.push_back({0, POLLIN, 0});
    const size_t first_pump = fds.size();
    std::vector<LinePump*> pumps;
    for (auto& r : ranks_)
      for (LinePump* p : {r.out.get(), r.err.get()})
        if (p && p->wants_input()) {
          fds.push_back({p->fd(), POLLIN, 0});
          pumps.push_back(p);
        }
    const size_t first_sink = fds.size();
    OutputSink::add_polls(&fds);
    int n = ::poll(fds.data(), fds.size(), poll_timeout_ms(now));
    if (n < 0 && errno != EINTR) throw LaunchError(std::string("poll: ") + ::strerror(errno));
    if (n <= 0) continue;
    if (fds[0].revents) handle_wakeups();
    if (watch_stdin && fds[1].revents) handle_stdin();
    for (size_t i = 0; i < pumps.size(); ++i)
      if (fds[first_pump + i].revents) pumps[i]->pump();
    OutputSink::write_polled(fds.data() + first_sink, fds.size() - first_sink);
  }
  for (auto& r : ranks_) {
    if (r.out) r.out->close_and_flush();
    if (r.err) r.err->close_and_flush();
  }
}

// Every rank is gone: what is still queued for dsrun's stdout/stderr is written out. A job that
// dsrun was told to stop waits for its reader at most the kill grace; another stop signal ends
// the wait at once. A stop signal that came after the loop's last look counts as in the loop.
void Supervisor::finish() {
  int sig = finish_output(interrupted_ ? opt_.kill_grace_s : -1);
  if (sig == 0) return;
  if (!interrupted_) exit_status_ = 128 + sig;
  interrupted_ = true;
}

int Supervisor::poll_timeout_ms(Clock::time_point now) const {
  Clock::time_point until;
  if (alive() == 0)
    until = drain_deadline_;
  else if (shutting_down_ && !killed_)
    until = kill_deadline_;
  else
    return -1;  // nothing timed is pending: sleep until a pipe or a signal wakes us
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count() + 1;
  return static_cast<int>(std::max<long long>(0, ms));
}

void Supervisor::handle_wakeups() {
  unsigned char buf[64];
  ssize_t n;
  while ((n = ::read(wake_fd(), buf, sizeof buf)) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      int sig = buf[i];
      if (!is_stop_signal(sig)) continue;  // SIGCHLD: reap() runs on every loop iteration
      // Whatever the state (even while stopping the ranks after a failure), a stop signal means
      // the user wants the job over: no --max_restarts restart, and the exit status says so.
      const bool first = !interrupted_;
      if (first) exit_status_ = 128 + sig;
      interrupted_ = true;
      if (!shutting_down_) {
        say(std::string("received ") + signal_name(sig) + "; forwarding it to the " +
            std::to_string(alive()) + " running ranks");
        begin_shutdown(sig);
      } else if (!killed_ && alive() > 0) {
        say(std::string("received ") + signal_name(sig) +
            (first ? " while stopping the job" : " again") + "; killing the ranks now");
        kill_survivors(std::string("after ") + signal_name(sig) + " to dsrun");
      }
    }
  }
}

// A node agent's stdin is its ssh channel from the launching dsrun: EOF means that dsrun closed it
// (tearing the job down) or is gone, so the ranks must not run on. Other input is discarded.
void Supervisor::handle_stdin() {
  char buf[256];
  ssize_t n = ::read(0, buf, sizeof buf);
  if (n > 0 || (n < 0 && (errno == EINTR || errno == EAGAIN))) return;
  stdin_open_ = false;
  if (shutting_down_) return;
  say("the launching dsrun closed this node agent's input (job torn down, or its connection "
      "lost); stopping the " + std::to_string(alive()) + " running ranks on " + opt_.node.host);
  exit_status_ = 129;
  begin_shutdown(SIGTERM);
}

std::string Supervisor::where(const Rank& r) const {
  std::string w = "rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ")";
  return opt_.node.host.empty() ? w : w + " on " + opt_.node.host;
}

void Supervisor::reap() {
  std::vector<Rank*> failed;
  for (auto& r : ranks_) {
    if (r.pid <= 0 || r.reaped) continue;
    int status = 0;
    pid_t got = ::waitpid(r.pid, &status, WNOHANG);
    if (got == 0 || (got < 0 && errno == EINTR)) continue;
    r.reaped = true;
    r.status = got == r.pid ? status : 0;
    r.drain();  // its last words come before dsrun's verdict
    if (r.failed()) failed.push_back(&r);
  }
  if (shutting_down_ || failed.empty()) return;
  // Several failures seen in one pass: a rank killed by a signal is more likely the cause than a
  // peer that then exited with an error (its collective failed when the connection dropped).
  auto cause = std::min_element(failed.begin(), failed.end(), [](const Rank* a, const Rank* b) {
    bool sa = WIFSIGNALED(a->status), sb = WIFSIGNALED(b->status);
    return sa != sb ? sa : a->rank < b->rank;
  });
  report_failure(**cause);
  begin_shutdown(SIGTERM);
}

void Supervisor::report_failure(const Rank& r) {
  std::string what = where(r) + " ";
  if (WIFSIGNALED(r.status)) {
    int sig = WTERMSIG(r.status);
    what += "was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
    exit_status_ = 128 + sig;
  } else {
    what += "exited with status " + std::to_string(WEXITSTATUS(r.status));
    exit_status_ = WEXITSTATUS(r.status);
  }
  int others = alive();
  if (others == 1) what += "; terminating the other rank";
  if (others > 1) what += "; terminating the other " + std::to_string(others) + " ranks";
  say(what);
}

// Signals whole process groups, so a rank's own children (data loader workers, shells) go too.
// Reaped ranks' groups are signalled as well: their children may have outlived them.
void Supervisor::begin_shutdown(int sig) {
  shutting_down_ = true;
  shutdown_signal_ = sig;
  kill_deadline_ =
      Clock::now() + std::chrono::microseconds(static_cast<long long>(opt_.kill_grace_s * 1e6));
  for (const auto& r : ranks_)
    if (r.pid > 0) ::killpg(r.pid, sig);
}

void Supervisor::kill_survivors(const std::string& when) {
  killed_ = true;
  for (const auto& r : ranks_) {
    if (r.pid <= 0) continue;
    if (!r.reaped)
      say(where(r) + " is still running " + when + "; sending SIGKILL");
    ::killpg(r.pid, SIGKILL);
  }
}

// A rank 0 killed between creating the local all-reduce's shared-memory segment and unlinking it
// (src/comm/shm_segment.cpp) leaves the segment in /dev/shm until reboot. Every rank has exited
// now, so whatever still carries one of their pids is left over.
void Supervisor::remove_leftover_segments() {
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return;
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(dir)) names.push_back(e->d_name);
  ::closedir(dir);
  for (const auto& r : ranks_) {
    if (r.pid <= 0) continue;
    const std::string prefix = comm::shm_segment_prefix(r.pid).substr(1);  // without the '/'
    for (const auto& n : names) {
      if (n.compare(0, prefix.size(), prefix) != 0) continue;
      if (::shm_unlink(("/" + n).c_str()) == 0)
        say("removed the shared-memory segment /dev/shm/" + n + " left by " + where(r));
    }
  }
}

}  // namespace

JobOutcome run_job(const LaunchOptions& options) { return Supervisor(options).run(); }

}  // namespace launcher
}  // namespace deepspeed
