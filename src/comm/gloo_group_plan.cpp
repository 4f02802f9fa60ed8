#include "comm/gloo_group_plan.h"

#include <cstdlib>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "util/env_flag.h"
#include "comm/store_bytes.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace comm {

ExchangeMode gloo_exchange_mode_from_env() {
  const char* v = std::getenv("DS_GLOO_EXCHANGE");
  if (v == nullptr || *v == 0) return ExchangeMode::kAuto;
  const std::string s = v;
  if (s == "auto") return ExchangeMode::kAuto;
  if (s == "1" || s == "true") return ExchangeMode::kOn;
  if (s == "0" || s == "false") return ExchangeMode::kOff;
  throw ConfigError(fmt::format(
      "environment variable DS_GLOO_EXCHANGE='{}' must be auto (point-to-point messages with "
      "every receive posted first when the group spans hosts, the default), 1/true (always) or "
      "0/false (Gloo's alltoall and broadcasts)",
      s));
}

bool gloo_hierarchical_from_env() {
  return util::flag_from_env("DS_GLOO_HIERARCHICAL", true,
                             "reduce-scatters and all-gathers within each host, then across hosts, "
                             "where every host has the same number of ranks; the default",
                             "every rank to every rank");
}

std::optional<HostLayout> host_layout_of(const std::vector<std::string>& host_of_rank) {
  HostLayout layout;
  std::map<std::string, int> number;
  for (const std::string& host : host_of_rank) {
    auto [it, added] = number.emplace(host, layout.hosts);
    if (added) {
      ++layout.hosts;
      layout.ranks.emplace_back();
    }
    layout.host_of.push_back(it->second);
    layout.local_of.push_back(static_cast<int>(layout.ranks[it->second].size()));
    layout.ranks[it->second].push_back(static_cast<int>(layout.host_of.size()) - 1);
  }
  if (layout.hosts < 2) return std::nullopt;
  layout.per_host = static_cast<int>(layout.ranks[0].size());
  for (const auto& ranks : layout.ranks)
    if (static_cast<int>(ranks.size()) != layout.per_host) return std::nullopt;
  if (layout.per_host < 2) return std::nullopt;
  return layout;
}

GlooGroupPlan plan_gloo_group(c10d::Store& store, int rank, int world, ExchangeMode exchange,
                              bool hierarchical, const std::string& host) {
  // "<exchange mode> <hierarchical> <host identity, which may hold spaces>"
  const std::string mine = fmt::format("{} {}", static_cast<int>(exchange), hierarchical ? 1 : 0);
  store.set(fmt::format("ds_plan/{}", rank), store_bytes(mine + " " + host));
  std::vector<std::string> hosts(world);
  hosts[rank] = host;
  bool same_exchange = true, all_hierarchical = hierarchical;
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    std::istringstream in(store_string(store.get(fmt::format("ds_plan/{}", r))));
    int their_exchange = -1, their_hierarchical = 0;
    in >> their_exchange >> their_hierarchical >> std::ws;
    std::getline(in, hosts[r]);
    same_exchange = same_exchange && their_exchange == static_cast<int>(exchange);
    all_hierarchical = all_hierarchical && their_hierarchical == 1;
  }
  GlooGroupPlan plan;
  bool one_host = true;
  for (const std::string& h : hosts) one_host = one_host && h == host;
  plan.exchange = same_exchange && exchange != ExchangeMode::kOff &&
                  (exchange == ExchangeMode::kOn || !one_host);
  if (all_hierarchical) plan.hierarchy = host_layout_of(hosts);
  return plan;
}

}  // namespace comm
}  // namespace deepspeed
