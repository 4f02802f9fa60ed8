// All-reduce (or all-gather) latency, shared memory vs Gloo, between ranks on this host:
//
//   build/bin/dsrun --num_procs 2 build/bin/bench_shm_allreduce [--dtype fp32|bf16]
//       [--sizes 768,1024,...] (elements of a [1, C] row) [--ms 300] (time per point and path)
//       [--op all_reduce|all_gather|all_to_all] (all_gather: C elements gathered, C / ranks
//       from each; all_to_all: C elements in and out on each rank)
//
// The world communicator (init_distributed) has the shared-memory path, with its size limit
// raised for this run so that every size can be measured on both paths; a sub-group of the same
// ranks made with DS_SHM_ALLREDUCE=0 is the Gloo path. Each point alternates the two paths in
// rounds and reports the median of the per-round means (us per call, rank 0's clock). Prints a
// markdown table on rank 0.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_args.h"
#include "comm/gloo_communicator.h"
#include "deepspeed/comm.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace comm = deepspeed::comm;

struct Args {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes = {768, 1024, 4096, 16384, 65536, 262144, 1048576};
  double ms = 300;
  std::string op = "all_reduce";  // --op
};

constexpr const char* kUsage =
    "Usage: dsrun --num_procs N bench_shm_allreduce [--dtype fp32|bf16] [--sizes 768,1024,...] "
    "[--ms 300] "
    "[--op all_reduce|all_gather|all_to_all]";

// Exits 0 after the usage line on -h/--help, 2 naming the argument on a bad one (BenchArgs).
Args parse(int argc, char** argv) {
  const BenchArgs cl(argc, argv, kUsage);
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    // dsrun passes --local_rank=K, as DeepSpeed's launcher does (the rank is in the environment).
    if (k.rfind("--local_rank=", 0) == 0) continue;
    if (k != "--local_rank" && k != "--dtype" && k != "--sizes" && k != "--ms" && k != "--op")
      cl.fail("unknown argument '" + k + "'");
    if (i + 1 >= argc) cl.fail("missing value after " + k);
    const std::string v = argv[++i];
    if (k == "--dtype") {
      // The two the table in docs/benchmarks.md measures; anything else used to run fp32 silently.
      if (v == "fp32") {
        a.dtype = at::kFloat;
      } else if (v == "bf16") {
        a.dtype = at::kBFloat16;
      } else {
        cl.fail("--dtype '" + v + "' is not fp32 or bf16");
      }
    } else if (k == "--sizes") {
      a.sizes.clear();
      std::stringstream in(v);
      for (std::string s; std::getline(in, s, ',');) {
        const int64_t n = cl.whole_number(s, "--sizes");
        if (n < 1) cl.fail("--sizes: " + s + " is not a positive element count");
        a.sizes.push_back(n);
      }
      if (a.sizes.empty()) cl.fail("--sizes '" + v + "' names no size");
    } else if (k == "--op") {
      if (v != "all_reduce" && v != "all_gather" && v != "all_to_all")
        cl.fail("--op '" + v + "' is not all_reduce, all_gather or all_to_all");
      a.op = v;
    } else if (k == "--ms") {
      a.ms = cl.real_number(v, "--ms");
      if (!(a.ms > 0)) cl.fail("--ms '" + v + "' is not positive");
    }
  }
  return a;
}

// Mean microseconds per `op` over `iters` calls (a barrier first so ranks start together):
// all_reduce of `t`; all_gather into `t`, each rank's chunk of it its input; all_to_all of a copy
// of `t` into `t`.
double time_calls(comm::Communicator& c, at::Tensor& t, const std::string& op, int iters) {
  const int64_t chunk = t.numel() / c.world_size();
  const at::Tensor mine = t.view({-1}).narrow(0, c.rank() * chunk, chunk).clone();
  const at::Tensor whole = t.clone();
  auto call = [&] {
    if (op == "all_gather") return c.all_gather(t, mine);
    if (op == "all_to_all") return c.all_to_all(t, whole);
    return c.all_reduce(t);
  };
  c.barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) call()->wait();
  const std::chrono::duration<double, std::micro> us = Clock::now() - t0;
  return us.count() / iters;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  at::set_num_threads(1);
  const int64_t biggest = *std::max_element(a.sizes.begin(), a.sizes.end());
  const std::string biggest_bytes = std::to_string(biggest * c10::elementSize(a.dtype));
  ::setenv(a.op == "all_reduce" ? "DS_SHM_ALLREDUCE_MAX_BYTES" : "DS_SHM_ALLGATHER_MAX_BYTES",
           biggest_bytes.c_str(), 1);
  auto world = deepspeed::init_distributed();
  ::setenv("DS_SHM_ALLREDUCE", "0", 1);
  auto gloo = world->split(0, world->rank());
  ::unsetenv("DS_SHM_ALLREDUCE");
  if (comm::shm_allreduce_limit(*world) == 0) {
    std::cerr << "the world communicator has no shared-memory path (ranks on several hosts?)\n";
    return 1;
  }
  if (world->rank() == 0) {
    std::cout << fmt::format("| elements | bytes | shm us/call | Gloo us/call | Gloo / shm |\n"
                             "| ---: | ---: | ---: | ---: | ---: |\n");
  }
  for (int64_t n : a.sizes) {
    if (a.op != "all_reduce") n -= n % world->world_size();  // equal chunks
    if (n == 0) continue;
    at::Tensor t = at::ones({1, n}, a.dtype);
    // Calibrate the iteration count on the slower path (Gloo) so a round takes ~ms/5; every rank
    // uses rank 0's count.
    time_calls(*gloo, t, a.op, 3);
    time_calls(*world, t, a.op, 3);
    at::Tensor iters = at::tensor(
        {static_cast<int64_t>(std::max(3.0, a.ms / 5 * 1000 / time_calls(*gloo, t, a.op, 5)))});
    world->broadcast(iters, 0)->wait();
    const int k = static_cast<int>(iters.item<int64_t>());
    std::vector<double> shm_us, gloo_us;
    for (int round = 0; round < 5; ++round) {
      shm_us.push_back(time_calls(*world, t, a.op, k));
      gloo_us.push_back(time_calls(*gloo, t, a.op, k));
    }
    if (world->rank() == 0) {
      const double s = median(shm_us), g = median(gloo_us);
      std::cout << fmt::format("| {} | {} | {:.1f} | {:.1f} | {:.1f}x |\n", n,
                               n * c10::elementSize(a.dtype), s, g, g / s)
                << std::flush;
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "bench_shm_allreduce: error: " << e.what() << "\n";
  return 1;
}
