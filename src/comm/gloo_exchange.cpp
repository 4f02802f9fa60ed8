#include "comm/gloo_exchange.h"

#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "comm/store_bytes.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace comm {

void post_exchange(int rank, const std::vector<at::Tensor>& sends,
                   const std::vector<at::Tensor>& recvs, const PostMessage& post_recv,
                   const PostMessage& post_send) {
  const int world = static_cast<int>(recvs.size());
  // Every receive before any send (the point of this file). Receives from rank-1, rank-2, ...,
  // sends to rank+1, rank+2, ...: a rank's i-th send is its peer's i-th receive, and no two
  // ranks start by sending to the same peer.
  for (int i = 1; i < world; ++i) {
    const int src = (rank - i + world) % world;
    if (recvs[src].numel() > 0) post_recv(recvs[src], src);
  }
  for (int i = 1; i < world; ++i) {
    const int dst = (rank + i) % world;
    if (sends[dst].numel() > 0) post_send(sends[dst], dst);
  }
}

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

bool agree_on_gloo_exchange(c10d::Store& store, int rank, int world, ExchangeMode mode,
                            const std::string& host) {
  const std::string mine = std::to_string(static_cast<int>(mode));
  store.set(fmt::format("ds_exchange/{}", rank), store_bytes(mine + " " + host));
  bool same_mode = true, one_host = true;
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    const std::string theirs = store_string(store.get(fmt::format("ds_exchange/{}", r)));
    const size_t space = theirs.find(' ');
    same_mode = same_mode && theirs.substr(0, space) == mine;
    one_host = one_host && space != std::string::npos && theirs.substr(space + 1) == host;
  }
  if (!same_mode || mode == ExchangeMode::kOff) return false;
  return mode == ExchangeMode::kOn || !one_host;
}

}  // namespace comm
}  // namespace deepspeed
