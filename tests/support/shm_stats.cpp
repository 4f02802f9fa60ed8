#include "support/shm_stats.h"

#include <gtest/gtest.h>

#include <vector>

#include "support/ranks.h"
#include "support/scoped_env.h"

namespace dstest {

namespace comm = deepspeed::comm;

StatsBothWays stats_without_and_with_shm(const std::function<void(comm::CommunicatorPtr)>& body) {
  auto record = [&] {
    std::vector<comm::CommStats> stats(2);
    run_ranks(2, [&](comm::CommunicatorPtr c) {
      c->reset_stats();
      body(c);
      stats[c->rank()] = c->stats();
    });
    return stats[0];
  };
  StatsBothWays both;
  {
    ScopedEnv off("DS_SHM_ALLREDUCE", "0");
    both.gloo = record();
  }
  both.shm = record();
  return both;
}

void expect_counted_alike(const StatsBothWays& stats, const std::string& op, int64_t calls) {
  comm::CommStats shm = stats.shm, gloo = stats.gloo;
  ASSERT_EQ(shm.size(), 1u) << "only " << op << " is counted";
  ASSERT_EQ(shm.count(op), 1u) << op;
  EXPECT_EQ(shm[op].calls, calls);
  EXPECT_EQ(shm[op].calls, gloo[op].calls);
  EXPECT_EQ(shm[op].bytes, gloo[op].bytes);
  ASSERT_EQ(shm[op].by_size.size(), gloo[op].by_size.size());
  for (const auto& [bytes, s] : gloo[op].by_size)
    EXPECT_EQ(shm[op].by_size[bytes].calls, s.calls) << op << " of " << bytes << " bytes";
}

}  // namespace dstest
