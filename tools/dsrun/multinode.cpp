#include "multinode.h"

#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "capture.h"
#include "job_signals.h"
#include "output_pump.h"
#include "spawn.h"
#include "util/ascii.h"

extern char** environ;

namespace deepspeed {
namespace launcher {
namespace {

using Clock = std::chrono::steady_clock;

// After the kill grace the agents had to stop their ranks, how long their ssh may still take to
// report before dsrun kills it (an agent behind a cut link never reports).
constexpr auto kTeardownSlack = std::chrono::seconds(5);
// How long a host check over ssh may take in all (ssh's ConnectTimeout is 10 s).
constexpr auto kPreflightLimit = std::chrono::seconds(20);
// Host checks running at once (pdsh's default fan-out): a job on hundreds of nodes neither waits
// for one ssh after another nor opens hundreds of connections from the launching host at once.
constexpr size_t kPreflightFanout = 32;
constexpr auto kDrainAfterExit = std::chrono::seconds(1);

std::string self_path() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw LaunchError(std::string("cannot find dsrun's own path: ") + ::strerror(errno));
  return std::string(buf, n);
}

std::string current_dir() {
  char buf[4096];
  if (::getcwd(buf, sizeof buf) == nullptr)
    throw LaunchError(std::string("getcwd: ") + ::strerror(errno));
  return buf;
}

// This host's first non-loopback IPv4 address (what DeepSpeed takes from `hostname -I`).
std::string first_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_LOOPBACK) || !(a->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN];
    auto* in = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

// The host check's exit status when the working directory cannot be entered (dsrun --preflight
// itself exits 0 or 2, ssh 255, the shell 127 for a missing dsrun).
constexpr int kNoWorkingDir = 86;

// The ssh command that checks one host (host_check_error() reads its result).
std::vector<std::string> host_check_argv(const MultiNodeOptions& o, const std::string& host,
                                         bool is_node0, const std::string& dsrun) {
  std::vector<std::string> remote = {dsrun, "--preflight"};
  if (is_node0) {
    if (!o.master_addr.empty()) {
      remote.push_back("--master_addr");
      remote.push_back(o.master_addr);
    }
    remote.push_back("--master_port");
    remote.push_back(std::to_string(o.master_port));
  }
  remote.push_back(o.command.at(0));
  // PROGRAM is looked up as the job will look it up: after the job's own cd and exports (a PATH
  // set in .deepspeed_env counts). The agents (ssh, pdsh) fail in a directory a host lacks, so
  // the check does too, first with a status of its own so that it can say so. mpirun enters the
  // directory where it exists (else $HOME) and passes every value as written (-x, no shell).
  const std::string cwd = current_dir();
  std::string cmd;
  if (o.backend == Backend::kOpenMpi) {
    cmd = "cd " + shell_quote(cwd) + " 2>/dev/null || cd; ";
    std::string env = remote_prelude("", merge_env(o.exports, o.env_file), {});
    if (!env.empty()) cmd += env + " && ";
  } else {
    cmd = "cd " + shell_quote(cwd) + " 2>/dev/null || exit " + std::to_string(kNoWorkingDir) +
          "; " + remote_prelude(cwd, o.exports, o.env_file) + " && ";
  }
  cmd += "exec";
  for (const auto& w : remote) cmd += " " + shell_quote(w);
  // The check goes over the same ssh the job will use: pdsh's takes its options from
  // PDSH_SSH_ARGS_APPEND, mpirun's from OMPI_MCA_plm_rsh_args (--mca plm_rsh_args on mpirun's
  // command line is not seen here).
  std::vector<std::string> launcher_args;
  if (o.backend == Backend::kSsh) launcher_args = o.launcher_args;
  const char* extra = std::getenv(o.backend == Backend::kPdsh ? "PDSH_SSH_ARGS_APPEND"
                                                              : "OMPI_MCA_plm_rsh_args");
  if (o.backend != Backend::kSsh && extra) launcher_args = split_words(extra);
  return ssh_argv(host, o.ssh_port, launcher_args, cmd);
}

// Why the check of `host` failed ("" when it passed); `cwd` is the directory it tried to enter and
// `dsrun` the path it ran there.
std::string host_check_error(const Captured& c, const std::string& host, const std::string& cwd,
                             const std::string& dsrun) {
  if (c.timed_out)
    return "host " + host + " did not answer over ssh within 20 s " +
           "(pass --no_ssh_check to skip this check)";
  int rc = WIFEXITED(c.status) ? WEXITSTATUS(c.status) : 128 + WTERMSIG(c.status);
  if (rc == 255)
    return "cannot reach host " + host + " over ssh: " + last_line(c.err) +
           " (dsrun needs passwordless ssh to every host; --no_ssh_check skips this check)";
  if (rc == kNoWorkingDir)
    return "host " + host + ": cannot enter the working directory " + cwd +
           " (each node's ranks run in the directory dsrun was started from; it must exist on "
           "every host)";
  if (rc == 127)
    return "host " + host + ": dsrun is not at " + dsrun +
           " there (it must be installed at the same path on every host): " + last_line(c.err);
  if (rc != 0) {
    std::string why = last_line(c.err);
    if (why.rfind("dsrun: ", 0) == 0) why = why.substr(7);
    return "host " + host + ": " + why;
  }
  return "";
}

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// DeepSpeed's runner: the lines of the .deepspeed_env files (deepspeed_env_paths()) are exported
// to every node after the forwarded variables.
EnvList deepspeed_env_files() {
  const char* ds_env_file = std::getenv("DS_ENV_FILE");
  const char* home = std::getenv("HOME");
  EnvList out;
  for (const auto& path : deepspeed_env_paths(ds_env_file ? ds_env_file : "", home ? home : "",
                                              current_dir(), is_file)) {
    std::ifstream in(path);
    if (!in) throw LaunchError("cannot read " + path + ": " + ::strerror(errno));
    std::stringstream text;
    text << in.rdbuf();
    out = merge_env(out, parse_deepspeed_env(text.str(), path));
  }
  return out;
}

}  // namespace

Backend parse_backend(const std::string& name) {
  std::string n = ascii_lower(name);
  if (n == "ssh") return Backend::kSsh;
  if (n == "pdsh") return Backend::kPdsh;
  if (n == "openmpi" || n == "mpirun") return Backend::kOpenMpi;
  if (n == "slurm") return Backend::kSlurm;
  throw LaunchError("--launcher '" + name + "' is not one of ssh, pdsh, openmpi, slurm");
}

int run_preflight(const std::string& program, const std::string& master_addr, int master_port) {
  try {
    resolve_program(program);
    std::string addr = first_address();
    if (master_port > 0) check_port_free(master_addr.empty() ? "0.0.0.0" : master_addr, master_port);
    std::printf("dsrun-preflight addr=%s\n", addr.c_str());
    return 0;
  } catch (const LaunchError& e) {
    say(e.what());
    return 2;
  }
}

void prepare_hosts(MultiNodeOptions& o) {
  if (o.world.empty()) throw LaunchError("no hosts to run on");
  const bool via_mpi = o.backend == Backend::kOpenMpi || o.backend == Backend::kSlurm;
  const std::string launcher = o.backend == Backend::kSlurm ? "slurm" : "openmpi";
  if (via_mpi) require_first_slots(o.world, launcher);
  o.exports = forwarded_environment(environ);
  o.env_file = deepspeed_env_files();
  if (o.backend == Backend::kOpenMpi) {
    const char* rsh = std::getenv("OMPI_MCA_plm_rsh_args");
    o.launcher_args = mpirun_ssh_port_args(o.ssh_port, rsh ? rsh : "", o.launcher_args);
  }
  // mpirun -x and srun --export pass values on without a shell: a $VAR there reaches the ranks as
  // written (DeepSpeed's runners pass these values quoted, `K="V"`, likewise unexpanded).
  if (via_mpi)
    for (const auto& kv : o.env_file)
      if (kv.second.find_first_of("$`") != std::string::npos)
        say("warning: .deepspeed_env sets " + kv.first + "=" + kv.second + "; --launcher " +
            launcher + " passes it as written (no shell expands it on the way)");
  if (o.backend == Backend::kSlurm || !o.ssh_check) {
    // Nothing asked: node 0's name is the best guess (Slurm jobs resolve their node names).
    if (o.master_addr.empty()) o.master_addr = o.world[0].host;
    return;
  }
  // Every host is checked at once (kPreflightFanout at a time); a failure is reported for the
  // first failing host in the hostfile's order, whichever answered first, so the message does
  // not depend on timing.
  const std::string dsrun = self_path();
  const std::string cwd = current_dir();
  std::vector<std::vector<std::string>> checks;
  for (size_t i = 0; i < o.world.size(); ++i)
    checks.push_back(host_check_argv(o, o.world[i].host, i == 0, dsrun));
  std::vector<Captured> answers = run_all_captured(checks, kPreflightLimit, kPreflightFanout);
  std::string first_error;
  std::vector<std::string> also_failed;
  for (size_t i = 0; i < o.world.size(); ++i) {
    std::string why = host_check_error(answers[i], o.world[i].host, cwd, dsrun);
    if (why.empty()) continue;
    if (first_error.empty())
      first_error = why;
    else
      also_failed.push_back(o.world[i].host);
  }
  if (!first_error.empty()) {
    if (!also_failed.empty()) {
      first_error += "; the check failed on " + std::to_string(also_failed.size()) + " more host" +
                     (also_failed.size() == 1 ? "" : "s") + " too:";
      for (size_t k = 0; k < also_failed.size() && k < 8; ++k) first_error += " " + also_failed[k];
      if (also_failed.size() > 8) first_error += " ...";
    }
    throw LaunchError(first_error);
  }
  if (o.master_addr.empty()) {  // node 0's check printed its address
    const std::string& out = answers[0].out;
    size_t at = out.find("addr=");
    std::string addr = at == std::string::npos ? "" : last_line(out.substr(at + 5));
    if (addr.empty())
      throw LaunchError("host " + o.world[0].host +
                        " has no non-loopback IPv4 address for the rendezvous; pass --master_addr");
    o.master_addr = addr;
  }
}

namespace {

// One child of the launcher: an ssh to one node agent, or the single pdsh/mpirun/srun.
struct Child {
  std::string label;  // "node 1 (10.0.0.2)", "pdsh", "mpirun", "srun"
  pid_t pid = -1;
  int stdin_fd = -1;  // write end of the child's stdin (agents stop when it closes)
  bool reaped = false;
  int status = 0;
  bool via_ssh = false;
  // The agent reported a rank's end ("dsrun: rank R (pid P) on HOST exited with status S"): its
  // ssh then exits with the rank's status, and 255 is that, not a lost connection.
  bool rank_end_reported = false;
  std::unique_ptr<LinePump> out, err;
};

class Fanout {
 public:
  explicit Fanout(const MultiNodeOptions& o) : opt_(o) {}
  ~Fanout() {
    if (!hostfile_.empty()) ::unlink(hostfile_.c_str());
  }
  JobOutcome run();

 private:
  std::vector<std::pair<std::string, std::vector<std::string>>> commands();
  void write_hostfile(const std::string& what, const std::string& text);
  void start(const std::string& label, const std::vector<std::string>& argv,
             const std::vector<std::string>& env);
  void supervise();
  void reap();
  void report(const Child& c);
  void teardown();
  int alive() const;

  const MultiNodeOptions& opt_;
  std::string hostfile_;  // mpirun's -hostfile or srun's SLURM_HOSTFILE, removed with the Fanout
  std::vector<Child> children_;
  bool tearing_down_ = false;
  int kill_stage_ = 0;  // 0: waiting for agents, 1: SIGTERM sent to children, 2: SIGKILL sent
  Clock::time_point next_kill_;
  int exit_status_ = 0;
  bool interrupted_ = false;
};

int Fanout::alive() const {
  return static_cast<int>(std::count_if(children_.begin(), children_.end(),
                                        [](const Child& c) { return c.pid > 0 && !c.reaped; }));
}

// Writes `text` to a new file in /tmp (hostfile_), which lives as long as this attempt's mpirun or
// srun does.
void Fanout::write_hostfile(const std::string& what, const std::string& text) {
  char path[] = "/tmp/dsrun_hostfile_XXXXXX";
  int fd = ::mkstemp(path);
  if (fd < 0)
    throw LaunchError("cannot create " + what + " in /tmp: " + ::strerror(errno));
  bool ok = write_all(fd, text.data(), text.size());
  ::close(fd);
  hostfile_ = path;
  if (!ok) throw LaunchError("cannot write " + what + " " + hostfile_);
}

std::vector<std::pair<std::string, std::vector<std::string>>> Fanout::commands() {
  // No shell between mpirun/srun and the ranks: the .deepspeed_env lines are plain values there.
  EnvList exports = merge_env(opt_.exports, opt_.env_file);
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  if (opt_.backend == Backend::kOpenMpi) {
    write_hostfile("an MPI hostfile", mpi_hostfile_text(opt_.world));
    exports = merge_env(exports, {{"DSRUN_RESTART_COUNT", std::to_string(opt_.restart_count)}});
    out.push_back({"mpirun", mpirun_argv(opt_.world, hostfile_, opt_.launcher_args, exports,
                                         opt_.master_addr, opt_.master_port, opt_.command)});
    return out;
  }
  if (opt_.backend == Backend::kSlurm) {
    exports = merge_env(exports, {{"DSRUN_RESTART_COUNT", std::to_string(opt_.restart_count)}});
    auto argv = srun_argv(opt_.world, opt_.launcher_args, exports, opt_.master_addr,
                          opt_.master_port, opt_.command);
    // srun's task order (run() hands srun SLURM_HOSTFILE=hostfile_).
    write_hostfile("a SLURM_HOSTFILE", slurm_hostfile_text(opt_.world));
    out.push_back({"srun", argv});
    return out;
  }
  AgentJob job;
  job.dsrun_path = self_path();
  job.cwd = current_dir();
  job.exports = opt_.exports;
  job.env_file = opt_.env_file;
  job.world_info = encode_world(opt_.world);
  job.master_addr = opt_.master_addr;
  job.master_port = opt_.master_port;
  job.agent_flags = opt_.agent_flags;
  job.agent_flags.push_back("--restart_count");
  job.agent_flags.push_back(std::to_string(opt_.restart_count));
  job.command = opt_.command;
  if (opt_.backend == Backend::kPdsh) {
    out.push_back({"pdsh", pdsh_argv(opt_.world, opt_.launcher_args, agent_shell_command(job, "%n"))});
    return out;
  }
  for (size_t k = 0; k < opt_.world.size(); ++k)
    out.push_back({"node " + std::to_string(k) + " (" + opt_.world[k].host + ")",
                   ssh_argv(opt_.world[k].host, opt_.ssh_port, opt_.launcher_args,
                            agent_shell_command(job, std::to_string(k)))});
  return out;
}

void Fanout::start(const std::string& label, const std::vector<std::string>& argv,
                   const std::vector<std::string>& env) {
  // stdin piped: the agents stop when it closes (dsrun gone). A child that cannot start is not
  // kept: the error names its program, and run() stops the ones started before it.
  const PipedChild child =
      spawn_piped(RankCommand{resolve_program(argv[0]), argv, env}, /*pipe_stdin=*/true);
  children_.emplace_back();
  Child& c = children_.back();
  c.label = label;
  c.via_ssh = opt_.backend == Backend::kSsh;
  c.pid = child.pid;
  // The agents prefix their ranks' lines already; dsrun's own lines pass through as they are.
  c.out = std::make_unique<LinePump>(child.out_fd, 1, "", -1);
  c.err = std::make_unique<LinePump>(child.err_fd, 2, "", -1);
  c.stdin_fd = child.in_fd;
  if (c.via_ssh) {
    // Found by index: children_ may grow (and move) after this.
    const size_t k = children_.size() - 1;
    c.err->set_observer([this, k](const std::string& line) {
      if (line.rfind("dsrun: rank ", 0) == 0 &&
          (line.find(" exited with status ") != std::string::npos ||
           line.find(" was killed by signal ") != std::string::npos))
        children_[k].rank_end_reported = true;
    });
  }
  if (opt_.backend == Backend::kPdsh) {
    // pdsh waits for every host and does not stop the others when one fails; its line
    // "pdsh@HOST: H: ssh exited with exit code N" is the only early sign, so dsrun acts on it.
    c.err->set_observer([this](const std::string& line) {
      if (tearing_down_ || line.find(": ssh exited with exit code ") == std::string::npos) return;
      say("pdsh reports a failed node (" + line + "); stopping the other nodes");
      std::string code = line.substr(line.rfind(' ') + 1);
      exit_status_ = std::atoi(code.c_str());
      if (exit_status_ == 0) exit_status_ = 1;
      teardown();
    });
  }
}

JobOutcome Fanout::run() {
  std::vector<std::pair<std::string, std::vector<std::string>>> cmds;
  try {
    cmds = commands();
  } catch (const LaunchError& e) {
    say(e.what());
    return {2, /*started=*/false, false};  // e.g. srun cannot carry a value: nothing to retry
  }
  std::map<std::string, std::string> extra;
  if (opt_.backend == Backend::kSlurm) extra["SLURM_HOSTFILE"] = hostfile_;
  if (opt_.backend == Backend::kPdsh) {
    const char* user = std::getenv("PDSH_SSH_ARGS_APPEND");
    extra["PDSH_SSH_ARGS_APPEND"] =
        pdsh_ssh_args(opt_.ssh_port) + (user && *user ? std::string(" ") + user : "");
  }
  std::vector<std::string> env = merge_environment(environ, extra);
  SignalScope signals;
  try {
    for (const auto& c : cmds) start(c.first, c.second, env);
  } catch (const LaunchError& e) {
    say(std::string(e.what()) + "; stopping what was started");
    exit_status_ = 1;
    teardown();
  }
  supervise();
  if (int sig = finish_output(interrupted_ ? opt_.kill_grace_s : -1)) {  // as launcher.cpp
    if (!interrupted_) exit_status_ = 128 + sig;
    interrupted_ = true;
  }
  // srun/pdsh/mpirun missing here: the same error again on a restart.
  const bool started = std::any_of(children_.begin(), children_.end(),
                                   [](const Child& c) { return c.pid > 0; });
  return {exit_status_, started, interrupted_};
}

void Fanout::supervise() {
  bool draining = false;
  Clock::time_point drain_deadline;
  for (;;) {
    reap();
    auto now = Clock::now();
    if (tearing_down_ && alive() > 0 && kill_stage_ < 2 && now >= next_kill_) {
      ++kill_stage_;
      int sig = kill_stage_ == 1 ? SIGTERM : SIGKILL;
      for (const auto& c : children_)
        if (c.pid > 0 && !c.reaped) {
          say(c.label + " has not stopped; sending " + signal_name(sig) + " to its " +
              (c.via_ssh ? "ssh" : "launcher"));
          ::killpg(c.pid, sig);
        }
      next_kill_ = now + std::chrono::seconds(2);
    }
    if (alive() == 0) {
      if (!draining) {
        draining = true;
        drain_deadline = now + kDrainAfterExit;
      }
      bool open = false;
      for (const auto& c : children_) open = open || c.out->is_open() || c.err->is_open();
      if (!open || now >= drain_deadline) break;
    }
    // Bounded work per turn, as in the single-node supervisor (launcher.cpp).
    std::vector<pollfd> fds = {{wake_fd(), POLLIN, 0}};
    std::vector<LinePump*> pumps;
    for (auto& c : children_)
      for (LinePump* p : {c.out.get(), c.err.get()})
        if (p && p->wants_input()) {
          fds.push_back({p->fd(), POLLIN, 0});
          pumps.push_back(p);
        }
    const size_t first_sink = fds.size();
    OutputSink::add_polls(&fds);
    int timeout = 200;  // reap() also runs on this tick: SIGCHLD wakes us sooner
    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n <= 0) continue;
    if (fds[0].revents) {
      unsigned char buf[64];
      ssize_t got;
      while ((got = ::read(wake_fd(), buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < got; ++i) {
          if (!is_stop_signal(buf[i])) continue;
          // As in launcher.cpp: any stop signal, even during a teardown after a failure, ends
          // the job for good (no --max_restarts restart) and sets the exit status.
          if (!interrupted_) exit_status_ = 128 + buf[i];
          interrupted_ = true;
          if (!tearing_down_) {
            say(std::string("received ") + signal_name(buf[i]) + "; stopping the job on every node");
            teardown();
          } else {
            next_kill_ = Clock::now();  // a signal during the teardown: escalate now
          }
        }
    }
    for (size_t i = 0; i < pumps.size(); ++i)
      if (fds[1 + i].revents) pumps[i]->pump();
    OutputSink::write_polled(fds.data() + first_sink, fds.size() - first_sink);
  }
  for (auto& c : children_) {
    c.out->close_and_flush();
    c.err->close_and_flush();
    if (c.stdin_fd >= 0) ::close(c.stdin_fd);
  }
}

void Fanout::reap() {
  for (auto& c : children_) {
    if (c.pid <= 0 || c.reaped) continue;
    int status = 0;
    pid_t got = ::waitpid(c.pid, &status, WNOHANG);
    if (got == 0 || (got < 0 && errno == EINTR)) continue;
    c.reaped = true;
    c.status = got == c.pid ? status : 0;
    c.out->drain();
    c.err->drain();
    bool failed = !WIFEXITED(c.status) || WEXITSTATUS(c.status) != 0;
    if (failed && !tearing_down_) {
      report(c);
      teardown();
    }
  }
}

void Fanout::report(const Child& c) {
  std::string what = c.label;
  if (WIFSIGNALED(c.status)) {
    int sig = WTERMSIG(c.status);
    what += ": its " + std::string(c.via_ssh ? "ssh" : "launcher") + " was killed by signal " +
            std::to_string(sig) + " (" + signal_name(sig) + ")";
    exit_status_ = 128 + sig;
  } else if (c.via_ssh && WEXITSTATUS(c.status) == 255 && !c.rank_end_reported) {
    what += ": lost the ssh connection to its agent (ssh exited 255: the agent or the host was "
            "killed, or the link is down)";
    exit_status_ = 255;
  } else {
    what += " failed with exit status " + std::to_string(WEXITSTATUS(c.status));
    exit_status_ = WEXITSTATUS(c.status);
  }
  int others = alive();
  if (others > 0)
    what += "; stopping the other " + std::to_string(others) + (others == 1 ? " node" : " nodes");
  say(what);
}

void Fanout::teardown() {
  tearing_down_ = true;
  // Closing an agent's stdin is the request to stop: it sends its ranks SIGTERM, then SIGKILL
  // after the kill grace. Its ssh is signalled only if that has not ended it in time.
  for (auto& c : children_)
    if (c.stdin_fd >= 0) {
      ::close(c.stdin_fd);
      c.stdin_fd = -1;
    }
  if (opt_.backend != Backend::kSsh) {
    // mpirun/srun tear their ranks down themselves on SIGTERM. pdsh does not pass its stdin on:
    // killing it (and the ssh processes in its group) closes every agent's channel instead.
    for (const auto& c : children_)
      if (c.pid > 0 && !c.reaped) ::killpg(c.pid, SIGTERM);
    kill_stage_ = 1;
    next_kill_ = Clock::now() + std::chrono::microseconds(static_cast<long long>(opt_.kill_grace_s * 1e6));
    return;
  }
  next_kill_ = Clock::now() + std::chrono::microseconds(static_cast<long long>(opt_.kill_grace_s * 1e6)) +
               kTeardownSlack;
}

}  // namespace

JobOutcome run_multinode(const MultiNodeOptions& options) {
  try {
    return Fanout(options).run();
  } catch (const LaunchError& e) {
    say(e.what());
    return {1, true, false};
  }
}

}  // namespace launcher
}  // namespace deepspeed
