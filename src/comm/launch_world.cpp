#include "comm/launch_world.h"

#include <cstdio>

#include "config/blocks.h"
#include "util/host_allocator.h"

namespace deepspeed {
namespace comm {

CommunicatorPtr world_or_launch(const std::string& caller, CommunicatorPtr given,
                                const InitOptions& options) {
  // Every entry point passes here, with or without a communicator of its own
  // (util/host_allocator.h).
  util::tune_host_allocator();
  if (given) return given;
  if (auto w = world()) return w;
  const ProcessInfo info = detect_process_info();
  if (info.world_size == 1) return make_single_process_communicator();
  CommunicatorPtr w = init_distributed(options);
  if (w->rank() == 0) {
    std::printf("[deepspeed] %s: init_distributed() was not called; the launcher's environment "
                "(%s) makes this process rank 0 of %d, so %s called it, as deepspeed.initialize() "
                "does (backend %s, MASTER_ADDR %s:%d)\n",
                caller.c_str(), info.source.c_str(), info.world_size, caller.c_str(),
                w->backend().c_str(), info.master_addr.c_str(), info.master_port);
    std::fflush(stdout);
  }
  return w;
}

InitOptions init_options_for_config(const std::string& config_path,
                                    const nlohmann::json& config_json) {
  InitOptions options;
  if (!config_path.empty()) {
    options.config_path = config_path;
    return options;
  }
  if (!config_json.is_object()) return options;  // initialize() says what the root must be
  std::vector<std::string> unused;  // no warnings: only one key is read (parse_config warns)
  config::Warnings warnings(&unused);
  config::ObjectReader top(config_json, "", warnings);
  if (auto seconds = config::read_comm_timeout_seconds(top))
    options.timeout = std::chrono::seconds(*seconds);
  return options;
}

}  // namespace comm
}  // namespace deepspeed
