// Which hosts and slots a multi-node job runs on: DeepSpeed's hostfile, --include/--exclude,
// --num_nodes and --num_procs, and the "world info" string the per-node agents receive.
// Pure functions (no I/O besides reading the hostfile), unit-tested in tests/unit/dsrun_world_test.cpp.
// Used by dsrun's command line (main.cpp) and by the node agents (decode_world, place_node).
#pragma once
#include <string>
#include <vector>

namespace deepspeed {
namespace launcher {

// One host and the slot ids (GPU ids in DeepSpeed; one rank each) the job may use on it.
struct HostSlots {
  std::string host;
  std::vector<int> slots;
};
// In hostfile order: that order numbers the nodes and so the global ranks.
using Resources = std::vector<HostSlots>;

// Parses hostfile text: lines `HOST slots=N [ignored words...]`, `#` comments, blank lines.
// Throws LaunchError naming `path`, the line number and the line for a line without slots=N right
// after the host, slots < 1 or a repeated host.
Resources parse_hostfile(const std::string& text, const std::string& path);
// Reads and parses the file; throws LaunchError naming it when it cannot be read or is empty.
Resources read_hostfile(const std::string& path);

// The pool when there is no hostfile (DeepSpeed's {localhost: device count}): host "localhost"
// with slots 0 .. slots-1.
Resources local_pool(int slots);

// `NAME[:SLOT[,SLOT...]][@NAME...]` (DeepSpeed's --include/--exclude syntax) against `pool`.
// include keeps only what it names (a host without slots: all of its slots), in pool order;
// exclude removes what it names (a host without slots: the whole host). `flag` ("--include") is
// used in errors, which name an unknown host or slot, a malformed spec or a repeated host;
// `pool_name` says where the hosts come from ("host X is not in the hostfile (A, B)").
Resources include_only(const Resources& pool, const std::string& spec, const std::string& flag,
                       const std::string& pool_name = "the hostfile");
Resources exclude(const Resources& pool, const std::string& spec, const std::string& flag,
                  const std::string& pool_name = "the hostfile");

// The whole selection as DeepSpeed's runner does it: include or exclude (not both), then the first
// num_nodes hosts (<= 0: all), then the first num_procs slots of each (<= 0: all). Throws
// LaunchError when nothing is left, or num_nodes / num_procs asks for more than there is.
Resources select_resources(const Resources& pool, const std::string& include,
                           const std::string& exclude_spec, int num_nodes, int num_procs,
                           const std::string& pool_name = "the hostfile");

// World info for the agents: "HOST:S,S@HOST:S" (the --include syntax, so it is readable in `ps`).
std::string encode_world(const Resources& world);
// Throws LaunchError naming `text` when it is not valid world info.
Resources decode_world(const std::string& text);

// Where node `node_rank` sits: its ranks are first_rank .. first_rank+local_size-1.
struct NodePlacement {
  std::string host;
  int node_rank = 0;
  int num_nodes = 1;
  int first_rank = 0;
  int local_size = 1;
  int world_size = 1;
  std::vector<int> slots;
};
// Throws LaunchError when node_rank is not a node of `world`.
NodePlacement place_node(const Resources& world, int node_rank);

int world_size(const Resources& world);

}  // namespace launcher
}  // namespace deepspeed
