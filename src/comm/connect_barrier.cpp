#include "comm/connect_barrier.h"

#include <string>

#include <fmt/format.h>

#include "comm/store_bytes.h"
#include "deepspeed/errors.h"

namespace deepspeed::comm {

void wait_for_every_rank_connected(c10d::Store& store, int rank, int world_size,
                                   std::chrono::milliseconds timeout) {
  if (world_size == 1) return;
  auto mark = [](int r) { return fmt::format("ds_connected/{}", r); };
  store.set(mark(rank), store_bytes("1"));
  if (store.add("ds_connected/count", 1) == world_size) store.set("ds_connected/all", store_bytes("1"));
  try {
    store.wait({"ds_connected/all"}, timeout);
  } catch (const std::exception& e) {
    std::string missing;
    for (int r = 0; r < world_size; ++r) {
      if (!store.check({mark(r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    throw CommError(fmt::format("rank(s) {} did not finish connecting the group ({})",
                                missing.empty() ? "?" : missing, e.what()));
  }
}

}  // namespace deepspeed::comm
