// dsrun_test_worker: the program tests/launcher/*.sh start under dsrun. Behaviour by --mode:
//   ok               print the launcher's env and this argv, a stderr line, and a final line
//                    without '\n'; exit 0
//   exit3            print, then rank --fail_rank exits 3 (or --fail_status S); the others sleep
//                    (dsrun must stop them) or, with --fail_attempts N, exit 0 after --seconds;
//                    rank --fail_rank fails only while DSRUN_RESTART_COUNT < N (default: always);
//                    with --started_dir D every rank marks its start there and the failing rank
//                    fails only once all WORLD_SIZE ranks of its attempt have (at most 30 s)
//   hang_collective  every rank joins init_distributed() and loops all_reduce; rank --fail_rank
//                    writes its pid to --pid_file once the loop runs (the test kill -9s it)
//   leave_collective like hang_collective, but rank --fail_rank returns 0 from main once the loop
//                    runs: the others, left in their all_reduce, must fail at once
//   linger_exit      every rank joins init_distributed() and one all_reduce; rank 0 returns
//                    --status (default 0) at once, the others return 0 after --seconds. Every rank
//                    prints "rank R exit_ns T" from its last exit handler (the test checks that
//                    rank 0 left last)
//   ignore_term      ignore SIGTERM, write pid to --pid_file (if given), sleep (tests SIGKILL
//                    escalation)
//   sleep            sleep --seconds (default 60), writing pid to --pid_file (if given)
//   shm_leak         rank 0 creates a shared-memory segment named as the local all-reduce names
//                    them (comm/shm_name.h), prints its name and is killed by SIGKILL before it
//                    can unlink it, as a rank killed during the all-reduce's setup; the others
//                    sleep --seconds (dsrun must remove the segment once the job is over)
// Unknown arguments (e.g. a marker the test greps for with pgrep) are ignored.
// Built twice (tools/dsrun/CMakeLists.txt): dsrun_test_worker with DSRUN_WORKER_WITH_COMM (real
// collectives), dsrun_test_worker_lite without libtorch, where hang_collective only sleeps.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <string>

#include "comm/shm_name.h"

#ifdef DSRUN_WORKER_WITH_COMM
#include <torch/torch.h>

#include "deepspeed/comm.h"
#endif

namespace {

struct Args {
  std::string mode = "ok";
  int fail_rank = -1;
  std::string pid_file;
  double seconds = 60;
  int fail_attempts = 1 << 30;
  int timeout_s = 30;  // hang_collective: the collectives' timeout
  int status = 0;      // linger_exit: rank 0's exit status
  int fail_status = 3;  // exit3: the failing rank's exit status (255: what exit(-1) gives)
  std::string started_dir;  // exit3: where each rank marks its start (see the header)
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; ++i) {
    std::string k = argv[i];
    if (k == "--mode")
      a.mode = argv[++i];
    else if (k == "--fail_rank")
      a.fail_rank = std::atoi(argv[++i]);
    else if (k == "--pid_file")
      a.pid_file = argv[++i];
    else if (k == "--seconds")
      a.seconds = std::atof(argv[++i]);
    else if (k == "--fail_attempts")
      a.fail_attempts = std::atoi(argv[++i]);
    else if (k == "--status")
      a.status = std::atoi(argv[++i]);
    else if (k == "--fail_status")
      a.fail_status = std::atoi(argv[++i]);
    else if (k == "--timeout")
      a.timeout_s = std::atoi(argv[++i]);
    else if (k == "--started_dir")
      a.started_dir = argv[++i];
  }
  return a;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "<unset>";
}

int my_rank() { return std::atoi(env("RANK").c_str()); }

// Written to a temporary name then renamed, so the test never reads a half-written pid.
void write_pid(const std::string& path) {
  if (path.empty()) return;
  std::string tmp = path + ".tmp";
  std::ofstream(tmp) << ::getpid() << "\n";
  std::rename(tmp.c_str(), path.c_str());
}

void sleep_for(double seconds) {
  for (double slept = 0; slept < seconds; slept += 0.1) ::usleep(100000);
}

int mode_ok(int argc, char** argv) {
  for (const char* k : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "CROSS_RANK", "CROSS_SIZE", "OMP_NUM_THREADS",
                        "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "DSRUN_RESTART_COUNT",
                        "CUDA_VISIBLE_DEVICES", "FROM_DEEPSPEED_ENV"})
    std::cout << "env " << k << "=" << env(k) << "\n";
  // Under mpirun (dsrun --launcher openmpi) the rank comes from OpenMPI's variables instead.
  if (std::getenv("OMPI_COMM_WORLD_RANK"))
    for (const char* k : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"})
      std::cout << "env " << k << "=" << env(k) << "\n";
  for (int i = 0; i < argc; ++i) std::cout << "argv[" << i << "]=" << argv[i] << "\n";
  std::cout << std::flush;
  std::cerr << "stderr line from rank " << env("RANK") << std::endl;
  std::cout << "partial line without newline" << std::flush;
  return 0;
}

// The file --started_dir/RANK.RESTART, once this rank has printed its start line.
std::string start_mark(const Args& a, int rank) {
  return a.started_dir + "/" + std::to_string(rank) + "." + env("DSRUN_RESTART_COUNT");
}

// Until every rank of this attempt has marked its start, or 30 s. A fixed pause let a loaded
// machine tear the job down before a peer on the other host had printed (a test expected it).
void wait_for_peers_started(const Args& a) {
  const int world = std::atoi(env("WORLD_SIZE").c_str());
  for (int tries = 0; tries < 300; ++tries) {
    int started = 0;
    for (int r = 0; r < world; ++r) started += ::access(start_mark(a, r).c_str(), F_OK) == 0;
    if (started == world) return;
    sleep_for(0.1);
  }
  std::cerr << "rank " << my_rank() << ": not every rank started within 30 s" << std::endl;
}

int mode_exit3(const Args& a) {
  std::cout << "rank " << my_rank() << " started (restart " << env("DSRUN_RESTART_COUNT") << ")"
            << std::endl;
  if (!a.started_dir.empty()) std::ofstream(start_mark(a, my_rank())) << "started\n";
  const int restart = std::atoi(env("DSRUN_RESTART_COUNT").c_str());
  if (my_rank() == a.fail_rank && restart < a.fail_attempts) {
    if (a.started_dir.empty())
      sleep_for(0.3);  // let the peers start, so dsrun really has ranks to terminate
    else
      wait_for_peers_started(a);
    std::cerr << "rank " << my_rank() << " failing with status " << a.fail_status << std::endl;
    return a.fail_status;
  }
  sleep_for(a.seconds);
  return 0;
}

int mode_ignore_term(const Args& a) {
  ::signal(SIGTERM, SIG_IGN);
  write_pid(a.pid_file);
  std::cout << "rank " << my_rank() << " ignoring SIGTERM" << std::endl;
  sleep_for(a.seconds);
  return 0;
}

int mode_sleep(const Args& a) {
  write_pid(a.pid_file);
  std::cout << "rank " << my_rank() << " sleeping" << std::endl;
  sleep_for(a.seconds);
  return 0;
}

// hang_collective and leave_collective: every rank loops all_reduce of 1024 floats.
int collective_loop(const Args& a, bool leave) {
#ifdef DSRUN_WORKER_WITH_COMM
  try {
    deepspeed::comm::InitOptions opts;
    opts.timeout = std::chrono::seconds(a.timeout_s);
    auto comm = deepspeed::init_distributed(opts);
    auto t = torch::ones({1024});
    for (long step = 0;; ++step) {
      comm->all_reduce(t)->wait();
      t.fill_(1);
      if (step == 10) {
        std::cout << "rank " << comm->rank() << " in the all_reduce loop" << std::endl;
        if (comm->rank() == a.fail_rank) write_pid(a.pid_file);
        if (leave && comm->rank() == a.fail_rank) {
          std::cerr << "rank " << comm->rank() << " leaves the loop with status 0" << std::endl;
          return 0;
        }
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "rank " << my_rank() << " collective failed: " << e.what() << std::endl;
    return 1;
  }
#else
  // Without the comm library: the same shape (every rank busy until killed), no collective.
  (void)leave;
  std::cout << "rank " << my_rank() << " in the (simulated) collective loop" << std::endl;
  if (my_rank() == a.fail_rank) write_pid(a.pid_file);
  sleep_for(a.seconds);
  return 0;
#endif
}

void print_exit_time() {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  std::printf("rank %d exit_ns %lld\n", my_rank(), now.tv_sec * 1000000000LL + now.tv_nsec);
  std::fflush(stdout);
}

int mode_linger_exit(const Args& a) {
  // Registered before init_distributed, so it runs after the library's own exit handlers.
  std::atexit(print_exit_time);
#ifdef DSRUN_WORKER_WITH_COMM
  deepspeed::comm::InitOptions opts;
  opts.timeout = std::chrono::seconds(a.timeout_s);
  auto comm = deepspeed::init_distributed(opts);
  auto t = torch::ones({16});
  comm->all_reduce(t)->wait();
  std::cout << "rank " << comm->rank() << " sum " << t[0].item<float>() << std::endl;
#endif
  if (my_rank() == 0) return a.status;
  sleep_for(a.seconds);
  return 0;
}

int mode_shm_leak(const Args& a) {
  if (my_rank() != 0) {
    sleep_for(a.seconds);
    return 0;
  }
  const std::string name = deepspeed::comm::shm_segment_name(::getpid(), 0);
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 || ::ftruncate(fd, 4096) != 0) {
    std::perror("shm_open");
    return 1;
  }
  std::cout << "rank 0 created " << name << std::endl;
  ::raise(SIGKILL);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  if (a.mode == "ok") return mode_ok(argc, argv);
  if (a.mode == "exit3") return mode_exit3(a);
  if (a.mode == "ignore_term") return mode_ignore_term(a);
  if (a.mode == "sleep") return mode_sleep(a);
  if (a.mode == "hang_collective") return collective_loop(a, false);
  if (a.mode == "leave_collective") return collective_loop(a, true);
  if (a.mode == "linger_exit") return mode_linger_exit(a);
  if (a.mode == "shm_leak") return mode_shm_leak(a);
  std::cerr << "dsrun_test_worker: unknown --mode " << a.mode << std::endl;
  return 64;
}
