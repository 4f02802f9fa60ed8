// initialize() without init_distributed() in a launched job: as deepspeed.initialize(), it calls
// init_distributed() itself when the launcher's variables (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT) say the world has more than one rank, instead of running each process as a job of
// one. comm::world() is one per process, so the ranks are forked processes here (threads would
// share it), each with its own launch environment.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "deepspeed/deepspeed.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/ranks.h"

namespace launch_env_test {

namespace {
using nlohmann::json;

struct TinyNetImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  TinyNetImpl() { fc = register_module("fc", torch::nn::Linear(4, 1)); }
  torch::Tensor forward(torch::Tensor x) { return fc->forward(x).pow(2).mean(); }
};

// One launched rank: the launcher's variables set as dsrun sets them, stdout and stderr into
// `log`; initialize() with no InitializeArgs.comm; exits 0 when the engine sees `world` ranks and
// its own rank, after one training step taken together. Rank 0 then waits for `release` to close
// (the parent closes it once rank 1 is gone: rank 0's process hosts the rendezvous store, and a
// peer still holding a store client when it closes would abort).
[[noreturn]] void run_rank(int rank, int world, int port, const std::string& log, int release) {
  std::freopen(log.c_str(), "w", stdout);
  ::dup2(::fileno(stdout), 2);
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  int code = 0;
  try {
    at::set_num_threads(1);
    const json config = {{"train_micro_batch_size_per_gpu", 2},
                         {"comm_timeout_seconds", 30},
                         {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}}};
    auto r = deepspeed::initialize<TinyNetImpl>(
        {.model = std::make_shared<TinyNetImpl>(), .config_json = config});
    const auto comm = r.engine->communicator();
    std::printf("rank %d: world_size %d, rank %d, train_batch_size %lld, initialized %d\n", rank,
                comm->world_size(), comm->rank(),
                static_cast<long long>(r.engine->train_batch_size()),
                deepspeed::comm::is_initialized() ? 1 : 0);
    if (comm->world_size() != world || comm->rank() != rank ||
        r.engine->train_batch_size() != 2 * world || deepspeed::comm::is_initialized() != (world > 1))
      code = 2;
    if (code == 0) {
      r.engine->backward(r.engine->forward(torch::randn({2, 4})));
      r.engine->step();
      comm->barrier();
    }
  } catch (const std::exception& e) {
    std::printf("rank %d failed: %s\n", rank, e.what());
    code = 1;
  }
  std::fflush(nullptr);
  if (rank == 0 && release >= 0) {
    char byte;
    while (::read(release, &byte, 1) > 0) {
    }
  }
  _exit(code);  // no atexit handlers or static destructors of the test program's state
}

// Forks `world` ranks, waits for them (at most 120 s, then kills them) and returns their exit
// statuses; rank 0 is released once every other rank has exited.
std::vector<int> launch(int world, const dstest::TempDir& dir) {
  const int port = dstest::free_tcp_port();
  int release[2];
  if (::pipe(release) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(release[1]);
      run_rank(r, world, port, dir / ("rank" + std::to_string(r) + ".log"), release[0]);
    }
    pids.push_back(pid);
  }
  ::close(release[0]);
  std::vector<int> status(world, -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto reap = [&](int r) {
    while (status[r] == -1) {
      int s = 0;
      if (::waitpid(pids[r], &s, WNOHANG) == pids[r]) {
        status[r] = s;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        for (pid_t p : pids) ::kill(p, SIGKILL);
        ::waitpid(pids[r], &s, 0);
        status[r] = s;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  for (int r = world - 1; r >= 1; --r) reap(r);
  ::close(release[1]);  // rank 0 may leave now
  reap(0);
  return status;
}

std::string logs(int world, const dstest::TempDir& dir) {
  std::string all;
  for (int r = 0; r < world; ++r)
    all += "--- rank " + std::to_string(r) + ":\n" +
           dstest::read_bytes(dir / ("rank" + std::to_string(r) + ".log"));
  return all;
}
}  // namespace

// WORLD_SIZE=2 without init_distributed(): the two processes form one job of 2 ranks (before,
// each was rank 0 of 1, counting the batch, reading the data and writing checkpoints alone), and
// rank 0 says why.
TEST(LaunchEnvironment, InitializeJoinsTheLaunchedJob) {
  dstest::TempDir dir("ds_launch_env");
  const auto status = launch(2, dir);
  const std::string text = logs(2, dir);
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0)
        << "rank " << r << " status " << status[r] << "\n" << text;
  const std::string rank0 = dstest::read_bytes(dir / "rank0.log");
  EXPECT_CONTAINS(rank0, "rank 0: world_size 2, rank 0, train_batch_size 4, initialized 1");
  EXPECT_CONTAINS(rank0, "initialize(): init_distributed() was not called");
  EXPECT_CONTAINS(rank0, "rank 0 of 2");
  // One line, on rank 0 only.
  EXPECT_EQ(dstest::occurrences(text, "init_distributed() was not called"), 1u) << text;
}

// WORLD_SIZE=1 stays a single process: nothing is initialised (no rendezvous store is hosted at
// MASTER_PORT) and nothing is printed.
TEST(LaunchEnvironment, AWorldOfOneStaysASingleProcess) {
  dstest::TempDir dir("ds_launch_env");
  const auto status = launch(1, dir);
  const std::string text = logs(1, dir);
  EXPECT_TRUE(WIFEXITED(status[0]) && WEXITSTATUS(status[0]) == 0) << text;
  EXPECT_CONTAINS(text, "rank 0: world_size 1, rank 0, train_batch_size 2, initialized 0");
  EXPECT_EQ(text.find("init_distributed() was not called"), std::string::npos) << text;
}

}  // namespace launch_env_test
