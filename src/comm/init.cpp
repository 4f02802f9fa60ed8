// Rendezvous: rank 0 hosts a c10d TCPStore at MASTER_ADDR:MASTER_PORT, every rank connects to it
// and the Gloo group exchanges its addresses through it.
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/exit_order.h"
#include "comm/gloo_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/peer_watch.h"
#include "deepspeed/device.h"
#include "comm/process_info.h"
#include "comm/work.h"
#include "util/host_allocator.h"

namespace deepspeed {
namespace comm {
namespace {

std::mutex g_world_mu;
CommunicatorPtr g_world;

bool mentions_port_in_use(const std::string& msg) {
  return msg.find("in use") != std::string::npos || msg.find("EADDRINUSE") != std::string::npos;
}

c10::intrusive_ptr<c10d::Store> connect_store(const ProcessInfo& info,
                                              std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(info.master_port);
  opts.isServer = info.rank == 0;
  opts.numWorkers = static_cast<std::size_t>(info.world_size);
  opts.waitWorkers = true;
  opts.timeout = timeout;
  const std::string where = fmt::format("{}:{}", info.master_addr, info.master_port);
  auto start = std::chrono::steady_clock::now();
  try {
    return c10::make_intrusive<c10d::TCPStore>(info.master_addr, opts);
  } catch (...) {
    const std::string cause = current_exception_message();
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (opts.isServer && mentions_port_in_use(cause)) {
      throw CommError(fmt::format(
          "rank 0 cannot host the rendezvous store at {}: port {} is already in use (another job "
          "or a leftover process holds it; choose another MASTER_PORT / --master_port): {}",
          where, info.master_port, cause));
    }
    throw CommError(fmt::format(
        "rendezvous at {} ({}) failed on rank {} of {} after {:.1f} s (timeout {:g} s): {}", where,
        opts.isServer ? "hosting the store" : "connecting to rank 0's store", info.rank,
        info.world_size, elapsed.count(), timeout.count() / 1000.0, cause));
  }
}

// The peer watch (peer_watch.h) on a store connection of its own, so that its heartbeats never
// interleave with the group's use of the store. Best effort: a job runs without it.
void start_peer_watch_for(const ProcessInfo& info) {
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(info.master_port);
    opts.isServer = false;
    opts.waitWorkers = false;
    opts.timeout = std::chrono::seconds(2);  // a heartbeat that cannot get through gives up soon
    auto store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, opts);
    start_peer_watch(store, info.rank, info.world_size, local_address_towards(info.master_addr));
  } catch (...) {
  }
}

// "gloo" or "nccl" for this rank (InitOptions::backend, DS_COMM_BACKEND).
std::string choose_backend(const ProcessInfo& info, const InitOptions& options) {
  std::string backend = options.backend.empty() ? "auto" : options.backend;
  if (backend == "auto") {
    const char* env = std::getenv("DS_COMM_BACKEND");
    if (env && *env) backend = env;
  }
  if (backend == "gloo" || backend == "nccl") return backend;
  if (backend != "auto")
    throw ConfigError("communication backend \"" + backend +
                      "\" is not one of \"auto\", \"gloo\", \"nccl\" (InitOptions.backend or "
                      "DS_COMM_BACKEND)");
  const char* device = std::getenv("DS_DEVICE");
  if (!nccl_built() || !cuda_available() || (device && std::string(device) == "cpu")) return "gloo";
  // NCCL refuses two ranks on one GPU: it needs a GPU per rank of this node.
  const int ranks_here = local_world_size(info.world_size);
  return ranks_here <= cuda_device_count() ? "nccl" : "gloo";
}

// The world communicator and the store it was made on (null for a single process).
struct World {
  c10::intrusive_ptr<c10d::Store> store;
  CommunicatorPtr comm;
};

World make_world(const ProcessInfo& info, const InitOptions& options) {
  if (info.world_size == 1) return {{}, make_single_process_communicator()};
  const std::string backend = choose_backend(info, options);  // a bad value fails before the rendezvous
  auto store = connect_store(info, options.timeout);
  if (backend == "nccl") {
    const c10::Device device = resolve_device("cuda", info.local_rank);
    use_device(device);  // before NCCL's communicator opens a context
    return {store, make_nccl_communicator_on(store, info.rank, info.world_size, info.local_rank,
                                             device.index(), options.timeout)};
  }
  auto world = make_gloo_communicator_on(store, info.rank, info.world_size, info.local_rank,
                                         options.timeout, gloo_device_for(info.master_addr));
  start_peer_watch_for(info);
  return {store, world};
}

}  // namespace

CommunicatorPtr init_from_process_info(const ProcessInfo& info, const InitOptions& options) {
  return make_world(info, options).comm;
}

CommunicatorPtr init_distributed(const InitOptions& options) {
  std::lock_guard<std::mutex> lock(g_world_mu);
  if (g_world) return g_world;
  util::tune_host_allocator();  // once per process: every rank's steps reuse freed host memory
  InitOptions resolved = options;
  resolved.timeout = resolve_timeout(options);
  const ProcessInfo info = detect_process_info();
  World world = make_world(info, resolved);
  // Once per process (not in init_from_process_info, which tests call for several ranks in one
  // process): rank 0 must leave last (exit_order.h). At its exit it first drops the world, so that
  // a rank still in a collective with it fails at once.
  if (world.store) {
    arrange_exit_order(world.store, info, resolved.timeout, [] {
      std::lock_guard<std::mutex> lock(g_world_mu);
      g_world.reset();
    });
  }
  g_world = world.comm;
  if (comms_check_from_env()) g_world = with_comms_check(g_world);
  return g_world;
}

CommunicatorPtr world() {
  std::lock_guard<std::mutex> lock(g_world_mu);
  return g_world;
}

bool is_initialized() { return world() != nullptr; }

}  // namespace comm
}  // namespace deepspeed
