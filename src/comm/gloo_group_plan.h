// How a Gloo group moves host tensors, decided alike by every rank at setup from what each
// publishes in the group's store: its settings (DS_GLOO_EXCHANGE, DS_GLOO_HIERARCHICAL) and the
// host it runs on.
// - exchange: reduce-scatters, all-gathers and all-to-alls as point-to-point messages with every
//   receive posted first (gloo_exchange.h) instead of Gloo's alltoall and broadcasts.
// - hierarchy: reduce-scatters and all-gathers in two phases, within each host and across hosts
//   between the ranks of the same local index (gloo_hierarchy.h), so each host sends (H-1)/H of
//   the data across its link instead of L times that (L ranks per host).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace deepspeed {
namespace comm {

// DS_GLOO_EXCHANGE: "auto" or unset (the default): messages when the group spans more than one
// host (on one host Gloo's own collectives were as fast or faster: ZeRO-3 on 2 local ranks 146
// against 175 ms a step, docs/benchmarks.md); "1"/"true": always; "0"/"false": never (the
// benchmark's peer, and a way back). Throws ConfigError naming the variable for any other value.
enum class ExchangeMode { kAuto, kOn, kOff };
ExchangeMode gloo_exchange_mode_from_env();

// DS_GLOO_HIERARCHICAL: "1"/"true" or unset (the default): the two-phase reduce-scatter and
// all-gather where the group's layout allows it (host_layout_of); "0"/"false": never. Throws
// ConfigError naming the variable for any other value.
bool gloo_hierarchical_from_env();

// Which ranks share a host. Hosts are numbered in the order of their lowest rank, ranks within a
// host in rank order (their local index).
struct HostLayout {
  int hosts = 0;
  int per_host = 0;
  std::vector<int> host_of, local_of;  // by rank
  std::vector<std::vector<int>> ranks;  // ranks[h][l]: the rank at local index l on host h
};
// The layout of a group whose rank r runs on host_of_rank[r] (an identity string), when the
// two-phase collectives apply: at least 2 hosts, each with the same number (at least 2) of ranks.
std::optional<HostLayout> host_layout_of(const std::vector<std::string>& host_of_rank);

struct GlooGroupPlan {
  bool exchange = false;
  std::optional<HostLayout> hierarchy;  // set when every rank allows it and the layout fits
};

// COLLECTIVE over the group's store (keys ds_plan/<rank>), at setup: each rank publishes its
// settings and `host` (shm_host_identity(), or the identity a test gives its ranks) and reads
// every other rank's. Settings that differ between ranks keep Gloo's collectives for that choice
// (the safe side: a rank pairing messages with a peer running a broadcast would hang). Store waits
// are bounded by the store's timeout.
GlooGroupPlan plan_gloo_group(c10d::Store& store, int rank, int world, ExchangeMode exchange,
                              bool hierarchical, const std::string& host);

}  // namespace comm
}  // namespace deepspeed
