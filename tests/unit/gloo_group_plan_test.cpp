// What a Gloo group decides at setup (gloo_group_plan.h): messages only across hosts unless
// forced, Gloo's collectives when ranks' settings differ, the within/across-host collectives only
// for a layout of equal hosts with several ranks each, and the two variables' values.
#include "comm/gloo_group_plan.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <string>
#include <thread>
#include <vector>

#include "support/expect.h"
#include "support/scoped_env.h"

namespace gloo_group_plan_test {

namespace comm = deepspeed::comm;
using Mode = comm::ExchangeMode;

// Each rank's plan when rank r publishes modes[r], hierarchical[r] and hosts[r] (one thread per
// rank, one store): every rank must reach the same one.
comm::GlooGroupPlan planned(const std::vector<Mode>& modes, const std::vector<std::string>& hosts,
                            std::vector<bool> hierarchical = {}) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const int world = static_cast<int>(modes.size());
  if (hierarchical.empty()) hierarchical.assign(world, true);
  std::vector<comm::GlooGroupPlan> plans(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      plans[r] = comm::plan_gloo_group(*store, r, world, modes[r], hierarchical[r], hosts[r]);
    });
  for (auto& t : ranks) t.join();
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(plans[r].exchange, plans[0].exchange) << "rank " << r;
    EXPECT_EQ(plans[r].hierarchy.has_value(), plans[0].hierarchy.has_value()) << "rank " << r;
  }
  return plans[0];
}

bool agreed(const std::vector<Mode>& modes, const std::vector<std::string>& hosts) {
  return planned(modes, hosts).exchange;
}

TEST(GlooGroupPlan, AutoUsesMessagesOnlyWhenTheGroupSpansHosts) {
  EXPECT_FALSE(agreed({Mode::kAuto, Mode::kAuto, Mode::kAuto}, {"a", "a", "a"}));
  EXPECT_TRUE(agreed({Mode::kAuto, Mode::kAuto, Mode::kAuto}, {"a", "a", "b"}));
  // Host identities hold spaces (shm_host_identity): the whole string is compared.
  EXPECT_TRUE(agreed({Mode::kAuto, Mode::kAuto}, {"h 1 x", "h 1 y"}));
}

TEST(GlooGroupPlan, OnAndOffOverrideTheHostsAndDisagreementKeepsGloo) {
  EXPECT_TRUE(agreed({Mode::kOn, Mode::kOn}, {"a", "a"}));
  EXPECT_FALSE(agreed({Mode::kOff, Mode::kOff}, {"a", "b"}));
  EXPECT_FALSE(agreed({Mode::kAuto, Mode::kOn, Mode::kAuto}, {"a", "b", "c"}));
  EXPECT_FALSE(agreed({Mode::kOn, Mode::kOn, Mode::kOff}, {"a", "a", "a"}));
}

TEST(GlooGroupPlan, HostsAreNumberedByTheirLowestRankAndRanksByTheirOrder) {
  const auto layout = comm::host_layout_of({"b x", "a", "b x", "a", "c", "c"});
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(layout->hosts, 3);
  EXPECT_EQ(layout->per_host, 2);
  EXPECT_EQ(layout->host_of, (std::vector<int>{0, 1, 0, 1, 2, 2}));
  EXPECT_EQ(layout->local_of, (std::vector<int>{0, 0, 1, 1, 0, 1}));
  EXPECT_EQ(layout->ranks, (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 5}}));
}

TEST(GlooGroupPlan, TheTwoPhaseCollectivesNeedEqualHostsOfSeveralRanks) {
  EXPECT_FALSE(comm::host_layout_of({"a", "a", "a", "a"}).has_value()) << "one host";
  EXPECT_FALSE(comm::host_layout_of({"a", "b", "c"}).has_value()) << "one rank per host";
  EXPECT_FALSE(comm::host_layout_of({"a", "a", "b", "b", "b"}).has_value()) << "2 and 3 ranks";
  const std::vector<Mode> autos(4, Mode::kAuto);
  EXPECT_TRUE(planned(autos, {"a", "a", "b", "b"}).hierarchy.has_value());
  EXPECT_FALSE(planned(autos, {"a", "a", "b", "b"}, {true, true, false, true}).hierarchy)
      << "one rank with DS_GLOO_HIERARCHICAL=0 keeps every rank to every rank";
  // Independent of the exchange setting: the sub-groups decide theirs.
  const std::vector<Mode> offs(4, Mode::kOff);
  EXPECT_TRUE(planned(offs, {"a", "b", "a", "b"}).hierarchy.has_value());
}

TEST(GlooGroupPlan, TheVariablesAreReadAndAnythingElseNamed) {
  {
    dstest::ScopedEnv unset("DS_GLOO_EXCHANGE", nullptr), unset_h("DS_GLOO_HIERARCHICAL", nullptr);
    EXPECT_EQ(comm::gloo_exchange_mode_from_env(), Mode::kAuto);
    EXPECT_TRUE(comm::gloo_hierarchical_from_env());
  }
  const std::vector<std::pair<const char*, Mode>> cases{
      {"auto", Mode::kAuto}, {"1", Mode::kOn}, {"true", Mode::kOn}, {"0", Mode::kOff},
      {"false", Mode::kOff}};
  for (const auto& [value, mode] : cases) {
    dstest::ScopedEnv env("DS_GLOO_EXCHANGE", value);
    EXPECT_EQ(comm::gloo_exchange_mode_from_env(), mode) << value;
  }
  for (const auto& [value, on] : {std::pair{"1", true}, {"true", true}, {"0", false},
                                  {"false", false}}) {
    dstest::ScopedEnv env("DS_GLOO_HIERARCHICAL", value);
    EXPECT_EQ(comm::gloo_hierarchical_from_env(), on) << value;
  }
  dstest::ScopedEnv env("DS_GLOO_EXCHANGE", "on"), env_h("DS_GLOO_HIERARCHICAL", "auto");
  EXPECT_CONTAINS(dstest::message_of<std::exception>([] { comm::gloo_exchange_mode_from_env(); }),
                  "environment variable DS_GLOO_EXCHANGE='on' must be auto");
  EXPECT_CONTAINS(dstest::message_of<std::exception>([] { comm::gloo_hierarchical_from_env(); }),
                  "environment variable DS_GLOO_HIERARCHICAL='auto' must be 1/true");
}

}  // namespace gloo_group_plan_test
