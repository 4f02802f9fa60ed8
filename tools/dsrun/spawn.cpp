#include "spawn.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cstdlib>
#include <cstring>

namespace deepspeed {
namespace launcher {
namespace {

// Empty if path is a runnable file, else why not.
std::string why_not_executable(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ::strerror(errno);
  if (S_ISDIR(st.st_mode)) return "it is a directory";
  if (::access(path.c_str(), X_OK) != 0) return "it is not executable";
  return "";
}

std::string port_error(const std::string& addr, int port, int err) {
  std::string where = std::to_string(port) + " on " + addr;
  if (err == EADDRINUSE)
    return "--master_port " + where + " is already in use (choose another with --master_port)";
  if (err == EADDRNOTAVAIL)
    return "--master_addr " + addr +
           " is not an address of this machine (single-node dsrun runs rank 0 here)";
  return "cannot bind --master_port " + where + ": " + ::strerror(err);
}

}  // namespace

std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    std::string why = why_not_executable(program);
    if (!why.empty()) throw LaunchError("program '" + program + "' cannot be run: " + why);
    return program;
  }
  const char* path_env = std::getenv("PATH");
  std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (why_not_executable(candidate).empty()) return candidate;
    start = end + 1;
  }
  throw LaunchError("program '" + program + "' not found on PATH (give a path like ./" + program +
                    " for a file in the current directory)");
}

namespace {

// 0 if addr:port can be bound now, else the errno of the failed socket()/bind().
int try_bind(const addrinfo& a) {
  int fd = ::socket(a.ai_family, a.ai_socktype | SOCK_CLOEXEC, a.ai_protocol);
  if (fd < 0) return errno;
  // Like the rendezvous store: a port in TIME_WAIT counts as free, a listening one does not.
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int err = ::bind(fd, a.ai_addr, a.ai_addrlen) == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

}  // namespace

void check_port_free(const std::string& addr, int port) {
  if (port < 1 || port > 65535)
    throw LaunchError("--master_port " + std::to_string(port) + " is not a TCP port (1-65535)");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0)
    throw LaunchError("--master_addr " + addr + " cannot be resolved: " + ::gai_strerror(rc));
  // A name like "localhost" may give ::1 and 127.0.0.1; one usable address is enough, but a port
  // in use on any of them is a clash.
  int first_err = 0;
  bool any_ok = false;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int err = try_bind(*a);
    if (err == EADDRINUSE) first_err = err;
    if (err == 0) any_ok = true;
    if (err != 0 && first_err == 0) first_err = err;
  }
  ::freeaddrinfo(found);
  if (first_err == EADDRINUSE || !any_ok) throw LaunchError(port_error(addr, port, first_err));
}

int available_cpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int visible_gpu_count() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    int n = 0;
    for (const char* p = visible; *p != '\0';) {
      const char* end = std::strchr(p, ',');
      size_t len = end ? static_cast<size_t>(end - p) : std::strlen(p);
      if (len > 0) ++n;
      p += len + (end ? 1 : 0);
    }
    return n;  // set: it decides, even when it hides every device
  }
  int n = 0;
  if (DIR* dev = ::opendir("/dev")) {
    while (const dirent* e = ::readdir(dev)) {
      const char* name = e->d_name;
      if (std::strncmp(name, "nvidia", 6) == 0 && name[6] != '\0' &&
          std::strspn(name + 6, "0123456789") == std::strlen(name + 6))
        ++n;
    }
    ::closedir(dev);
  }
  return n;
}

int local_slot_count() {
  int gpus = visible_gpu_count();
  return gpus > 0 ? gpus : available_cpus();
}

std::vector<std::string> merge_environment(const char* const* base,
                                           const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> env;
  for (const char* const* e = base; e && *e; ++e) {
    std::string entry(*e);
    std::string key = entry.substr(0, entry.find('='));
    if (overrides.count(key) == 0) env.push_back(std::move(entry));
  }
  for (const auto& kv : overrides) env.push_back(kv.first + "=" + kv.second);
  return env;
}

namespace {

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Runs in the forked child: only async-signal-safe calls from here to exec.
[[noreturn]] void exec_child(const RankCommand& cmd, char* const* argv, char* const* envp,
                             int in_fd, int out_fd, int err_fd, pid_t launcher_pid) {
  ::setpgid(0, 0);
#ifdef __linux__
  // If dsrun itself is SIGKILLed, its ranks must not run on as orphans.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher_pid) ::_exit(126);
#endif
  // dsrun blocks and ignores some signals; the program starts with the defaults. Not SIGHUP:
  // dsrun catches it (exec resets that) unless it was ignored on entry (`nohup dsrun`), and then
  // the ranks must ignore it too, as they would under nohup themselves.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
  // Caught ones go back to the default now, not at exec: until then dsrun's handler would write
  // into its wake pipe, which this child still holds.
  for (int sig : {SIGHUP, SIGQUIT}) {
    struct sigaction current {};
    if (::sigaction(sig, nullptr, &current) == 0 && current.sa_handler != SIG_IGN)
      ::sigaction(sig, &dfl, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  int in = in_fd >= 0 ? in_fd : ::open("/dev/null", O_RDONLY);
  if (in >= 0) ::dup2(in, 0);
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  ::execve(cmd.path.c_str(), argv, envp);
  const char* msg = "dsrun: exec failed for ";
  (void)!::write(2, msg, ::strlen(msg));
  (void)!::write(2, cmd.path.c_str(), cmd.path.size());
  const char* reason = ::strerror(errno);  // not async-signal-safe in theory; fine after fork here
  (void)!::write(2, ": ", 2);
  (void)!::write(2, reason, ::strlen(reason));
  (void)!::write(2, "\n", 1);
  ::_exit(127);
}

}  // namespace

pid_t spawn_rank(const RankCommand& cmd, int out_fd, int err_fd, int in_fd) {
  std::vector<char*> argv = c_strings(cmd.argv);
  std::vector<char*> envp = c_strings(cmd.env);
  pid_t launcher_pid = ::getpid();
  // Every signal blocked across the fork: until the child has put the default dispositions back
  // (exec_child), dsrun's handlers are installed in it too, and one run there would write into
  // dsrun's wake pipe, which the child still holds: a SIGTERM that dsrun sent to the starting
  // rank would read as dsrun's own (seen under load). Blocked, it stays pending and acts once the
  // child has unblocked it with the defaults in place.
  sigset_t all, old;
  sigfillset(&all);
  ::sigprocmask(SIG_BLOCK, &all, &old);
  pid_t pid = ::fork();
  if (pid == 0) exec_child(cmd, argv.data(), envp.data(), in_fd, out_fd, err_fd, launcher_pid);
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) throw LaunchError(std::string("fork failed: ") + ::strerror(fork_errno));
  // Also set the group here: the supervisor may signal the group before the child runs setpgid.
  ::setpgid(pid, pid);
  return pid;
}

PipedChild spawn_piped(const RankCommand& cmd, bool pipe_stdin) {
  // [0] read end, [1] write end; -1 until made.
  int out[2] = {-1, -1}, err[2] = {-1, -1}, in[2] = {-1, -1};
  auto close_all = [&] {
    for (int* p : {out, err, in})
      for (int k : {0, 1})
        if (p[k] >= 0) ::close(p[k]);
  };
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
      (pipe_stdin && ::pipe2(in, O_CLOEXEC) != 0)) {
    const int e = errno;
    close_all();
    throw LaunchError(std::string("pipe: ") + ::strerror(e));
  }
  PipedChild child;
  try {
    child.pid = spawn_rank(cmd, out[1], err[1], in[0]);
  } catch (...) {
    close_all();
    throw;
  }
  for (int fd : {out[1], err[1], in[0]})
    if (fd >= 0) ::close(fd);
  child.out_fd = out[0];
  child.err_fd = err[0];
  child.in_fd = in[1];
  return child;
}

}  // namespace launcher
}  // namespace deepspeed
