// 0/1 Adam (optim/zero_one_adam.h) at stage 0 on 2 ranks as threads: which steps all-reduce the
// gradients, which run the compressed all-reduce and which communicate nothing (the local steps),
// step by step against the schedule worked out by hand from DeepSpeed's rules; ranks agree
// after every sync; and it trains the example GPT as well as Adam.
#include <gtest/gtest.h>

#include <mutex>
#include <set>

#include "gpt/model.h"
#include "support/ranks.h"
#include "support/training_run.h"

using nlohmann::json;

namespace {

json zero_one_config(int var_freeze_step, int var_update_scaler, int local_step_scaler,
                     int local_step_clipper) {
  json c = dstest::base_config(2, 1, 0);
  c["optimizer"] = {{"type", "ZeroOneAdam"},
                    {"params",
                     {{"lr", 3e-3},
                      {"weight_decay", 0.01},
                      {"var_freeze_step", var_freeze_step},
                      {"var_update_scaler", var_update_scaler},
                      {"local_step_scaler", local_step_scaler},
                      {"local_step_clipper", local_step_clipper}}}};
  return c;
}

struct StepTraffic {
  bool gradient_all_reduce = false;  // an all-reduce larger than the loss's
  int64_t all_to_all = 0;            // compressed all-reduces (one all-to-all each)
  int64_t calls = 0;                 // every collective of the step
};

}  // namespace

// var_freeze_step 4, var_update_scaler 2: variance steps 1, 2 (interval 1, then doubled to 2), 4;
// compressed-gradient steps 3 and 5 (phase 1 runs through step var_freeze_step + 1 = 5). Then
// local_step_scaler 2, local_step_clipper 4: local interval 1 for steps 6-7, 2 for 8-9, 4 from
// 10 on, so syncs at 6, 7, 8, 12, 16 and no collective but the loss's at 9-11 and 13-15.
TEST(ZeroOneAdam, LocalStepsSkipCommunicationOnDeepSpeedsSchedule) {
  const int steps = 16;
  auto config = zero_one_config(4, 2, 2, 4);
  auto data = dstest::test_text_dataset(16);
  torch::manual_seed(7);
  std::vector<std::shared_ptr<gpt::GPTImpl>> models;
  for (int r = 0; r < 2; ++r) models.push_back(std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 2, 2, 32}));
  std::vector<StepTraffic> traffic(steps);
  std::vector<double> spread(steps, -1);  // max - min over ranks of a parameter checksum
  std::mutex mu;
  dstest::run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto r = deepspeed::initialize<gpt::GPTImpl>(
        {.model = models[comm->rank()], .config_json = config, .training_data = data, .comm = comm});
    for (int s = 0; s < steps; ++s) {
      auto batch = r.training_dataloader->next();
      comm->reset_stats();
      r.engine->backward(r.engine->forward(batch.data, batch.target));
      r.engine->step();
      StepTraffic t;
      for (auto& [op, st] : comm->stats()) {
        t.calls += st.calls;
        if (op == "all_to_all") t.all_to_all = st.calls;
        if (op == "all_reduce" && st.bytes > 64) t.gradient_all_reduce = true;
      }
      // Do the ranks hold the same parameters? (measured outside the step's counters)
      double sum = 0;
      for (auto& p : models[comm->rank()]->parameters()) sum += p.to(torch::kDouble).sum().item<double>();
      auto hi = torch::tensor({sum}, torch::kDouble), lo = hi.clone();
      comm->all_reduce(hi, deepspeed::comm::ReduceOp::Max)->wait();
      comm->all_reduce(lo, deepspeed::comm::ReduceOp::Min)->wait();
      if (comm->rank() == 0) {
        std::lock_guard<std::mutex> lock(mu);
        traffic[s] = t;
        spread[s] = (hi - lo).item<double>();
      }
    }
  });
  const std::set<int> variance = {1, 2, 4}, compressed = {3, 5, 6, 7, 8, 12, 16};
  for (int s = 1; s <= steps; ++s) {
    const auto& t = traffic[s - 1];
    EXPECT_EQ(t.gradient_all_reduce, variance.count(s) == 1) << "step " << s;
    EXPECT_EQ(t.all_to_all, compressed.count(s) ? 1 : 0) << "step " << s;
    if (!variance.count(s) && !compressed.count(s)) EXPECT_EQ(t.calls, 1) << "step " << s << " (the loss only)";
    // Identical parameters whenever the step ended with a sync or a full average.
    if (s <= 5 || compressed.count(s)) EXPECT_EQ(spread[s - 1], 0.0) << "step " << s;
  }
  EXPECT_GT(spread[8], 0.0);  // step 9 was local: the ranks drifted apart, as they should
}

TEST(ZeroOneAdam, TrainsTheGptWithinFivePercentOfAdam) {
  dstest::RunSpec a, b;
  a.world_size = b.world_size = 2;
  a.steps = b.steps = 60;
  a.config = zero_one_config(/*var_freeze_step=*/20, /*var_update_scaler=*/4,
                             /*local_step_scaler=*/8, /*local_step_clipper=*/4);
  b.config = dstest::base_config(2, 1, 0);
  b.config["optimizer"]["params"]["bias_correction"] = false;
  auto zero_one = dstest::train_gpt(a), adam = dstest::train_gpt(b);
  auto tail_mean = [](const std::vector<double>& l) {
    double s = 0;
    for (size_t i = l.size() - 10; i < l.size(); ++i) s += l[i];
    return s / 10;
  };
  const double zo = tail_mean(zero_one.losses), ad = tail_mean(adam.losses);
  std::cout << "mean loss of steps 51-60: 0/1 Adam " << zo << ", Adam " << ad << " (first "
            << adam.losses.front() << ")\n";
  EXPECT_LT(std::abs(zo - ad) / ad, 0.05);
}
