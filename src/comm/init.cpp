// Rendezvous: rank 0 hosts a c10d TCPStore at MASTER_ADDR:MASTER_PORT, every rank connects to it
// and the Gloo group exchanges its addresses through it.
#include <fmt/format.h>

#include <mutex>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/gloo_communicator.h"
#include "comm/process_info.h"
#include "comm/work.h"

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

}  // namespace

CommunicatorPtr init_from_process_info(const ProcessInfo& info, const InitOptions& options) {
  if (info.world_size == 1) return make_single_process_communicator();
  auto store = connect_store(info, options.timeout);
  return make_gloo_communicator_on(store, info.rank, info.world_size, info.local_rank,
                                   options.timeout, gloo_device_for(info.master_addr));
}

CommunicatorPtr init_distributed(const InitOptions& options) {
  std::lock_guard<std::mutex> lock(g_world_mu);
  if (g_world) return g_world;
  InitOptions resolved = options;
  resolved.timeout = resolve_timeout(options);
  g_world = init_from_process_info(detect_process_info(), resolved);
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
