// Between an accumulation boundary's backward and engine.step(), ZeRO-Offload's update during
// backward (offload_optimizer.overlap_step) has already moved part of the optimizer state and the
// parameters. A save, a load, a forward or a look at the whole parameters there would see half a
// step (and race the update's thread), so each is refused with an error naming the key; nothing
// is written, and training goes on exactly as if they had not been tried.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>

#include "deepspeed/deepspeed.h"
#include "gpt/model.h"
#include "runtime/engine_state.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/training_run.h"

namespace half_done_step_test {

namespace {
using nlohmann::json;

const gpt::GPTConfig kModel{256, 16, 2, 2, 32};

json offload_config(bool overlap_step) {
  json config = dstest::base_config(2, 1, 2);
  config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"},
                                                      {"overlap_step", overlap_step}};
  return config;
}

// Step `step`'s batch, the same in every run.
at::Tensor batch(int step) {
  torch::manual_seed(1000 + step);
  return torch::randint(0, kModel.vocab_size, {2, kModel.block_size}, torch::kLong);
}

// The model (seeded alike in every run) and its engine under CPU optimizer offload.
struct OffloadRun {
  std::shared_ptr<gpt::GPTImpl> model;
  std::shared_ptr<deepspeed::ModelEngine<gpt::GPTImpl>> engine;
};
OffloadRun start(bool overlap_step) {
  at::set_num_threads(1);
  torch::manual_seed(7);
  auto model = std::make_shared<gpt::GPTImpl>(kModel);
  auto r = deepspeed::initialize<gpt::GPTImpl>({.model = model,
                                                .config_json = offload_config(overlap_step)});
  return {model, r.engine};
}

// Four steps on fixed batches; `between(engine, step)` runs after each step's backward.
std::vector<at::Tensor> train(
    bool overlap_step,
    const std::function<void(deepspeed::ModelEngine<gpt::GPTImpl>&, int)>& between) {
  auto run = start(overlap_step);
  auto& engine = *run.engine;
  for (int step = 0; step < 4; ++step) {
    at::Tensor x = batch(step);
    engine.backward(engine.forward(x, x));
    between(engine, step);
    engine.step();
  }
  std::vector<at::Tensor> weights;
  for (auto& p : run.model->parameters()) weights.push_back(p.detach().clone());
  return weights;
}

template <class Error, class Call>
void expect_refused(Call call, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << " was not refused";
  } catch (const Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), what);
    EXPECT_CONTAINS(std::string(e.what()), "offload_optimizer.overlap_step");
    EXPECT_CONTAINS(std::string(e.what()), "call engine.step() first");
  }
}

}  // namespace

// Without overlap_step the same window holds nothing half done: a save there is DeepSpeed's (the
// step's gradients are not part of it). With it, every such call is refused, nothing is written,
// and the run ends with the weights of the run that never tried them.
TEST(HalfDoneStep, SaveLoadForwardAndWholeParametersWaitForTheStep) {
  dstest::TempDir dir;
  train(false, [&](deepspeed::ModelEngine<gpt::GPTImpl>& engine, int step) {
    EXPECT_FALSE(deepspeed::state_of(engine).stage->update_begun_during_backward());
    if (step == 1) engine.save_checkpoint(dir.path(), "serial");
  });
  ASSERT_TRUE(std::filesystem::exists(dir / "serial"));

  auto plain = train(true, [](auto&, int) {});
  bool tried = false;
  auto refused = train(true, [&](deepspeed::ModelEngine<gpt::GPTImpl>& engine, int step) {
    ASSERT_TRUE(deepspeed::state_of(engine).stage->update_begun_during_backward());
    if (step != 2) return;
    expect_refused<deepspeed::CheckpointError>(
        [&] { engine.save_checkpoint(dir.path(), "half"); }, "save_checkpoint");
    expect_refused<deepspeed::CheckpointError>(
        [&] { engine.load_checkpoint(dir.path(), "serial"); }, "load_checkpoint");
    at::Tensor x = batch(5);
    expect_refused<deepspeed::Error>([&] { engine.forward(x, x); }, "forward");
    expect_refused<deepspeed::Error>([&] { engine.consolidated_state_dict(); },
                                     "consolidated_state_dict");
    tried = true;
  });
  EXPECT_TRUE(tried);
  EXPECT_FALSE(std::filesystem::exists(dir / "half")) << "a refused save wrote its folder";
  ASSERT_EQ(refused.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(refused[i], plain[i])) << i;
}

// A boundary backward that fails after the update during backward had begun leaves the optimizer
// partly stepped, and no step can complete it. The engine then refuses to step or to save that
// state, saying to load a checkpoint; a forward (nothing runs any more) and the load are allowed,
// and after the load training goes on exactly as if the failed pass had never run.
TEST(HalfDoneStep, AFailedBackwardAfterTheUpdateBeganIsRepairedOnlyByALoad) {
  dstest::TempDir dir;
  auto plain = train(true, [](auto&, int) {});

  auto run = start(true);
  auto& model = run.model;
  auto& engine = *run.engine;
  auto& stage = *deepspeed::state_of(engine).stage;
  bool fail = false;
  // The position embedding's gradient is among the last of backward: later layers' ranges have
  // been updated by then.
  model->named_parameters()["wpe.weight"].register_hook([&fail](const at::Tensor& g) {
    if (fail) throw std::runtime_error("injected failure late in backward");
    return g;
  });
  for (int step = 0; step < 2; ++step) {
    at::Tensor x = batch(step);
    engine.backward(engine.forward(x, x));
    engine.step();
  }
  engine.save_checkpoint(dir.path(), "before");

  at::Tensor x = batch(2);
  fail = true;
  EXPECT_ANY_THROW(engine.backward(engine.forward(x, x)));
  fail = false;
  ASSERT_TRUE(stage.step_lost()) << "no range was updated before the failure";
  EXPECT_FALSE(stage.update_begun_during_backward()) << "the update still runs after the failure";
  engine.forward(x, x);  // allowed: nothing races it now
  for (auto what : {"engine.step()", "save_checkpoint"}) {
    try {
      if (std::string(what) == "engine.step()")
        engine.step();
      else
        engine.save_checkpoint(dir.path(), "half");
      ADD_FAILURE() << what << " of a partly stepped state went through";
    } catch (const deepspeed::Error& e) {
      EXPECT_CONTAINS(std::string(e.what()), "partly stepped");
      EXPECT_CONTAINS(std::string(e.what()), "load");
      EXPECT_CONTAINS(std::string(e.what()), "overlap_step");
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "half"));
  // The weights alone do not repair it: the moments and Adam's step count stay half a step on.
  engine.load_checkpoint(dir.path(), "before", /*load_module_strict=*/true,
                         /*load_optimizer_states=*/false);
  EXPECT_TRUE(stage.step_lost()) << "a weights-only load cleared the lost step";
  EXPECT_THROW(engine.save_checkpoint(dir.path(), "half"), deepspeed::CheckpointError);
  engine.load_checkpoint(dir.path(), "before");
  EXPECT_FALSE(stage.step_lost());
  for (int step = 2; step < 4; ++step) {
    at::Tensor xs = batch(step);
    engine.backward(engine.forward(xs, xs));
    engine.step();
  }
  auto weights = model->parameters();
  ASSERT_EQ(weights.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(weights[i], plain[i])) << i;
}

}  // namespace half_done_step_test
