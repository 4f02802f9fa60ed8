// The flops profiler counts the FLOPs of the operators that ran (DeepSpeed's formulas), gives
// them to the right modules, and the engine prints DeepSpeed's report at profile_step.
#include "deepspeed/flops_profiler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "deepspeed/config.h"
#include "deepspeed/engine.h"
#include "deepspeed/errors.h"
#include "gpt/model.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/flops_report.h"
#include "support/training_run.h"

namespace flops_profiler_test {

namespace {
using deepspeed::profiling::FlopsProfiler;
using json = nlohmann::json;

const deepspeed::profiling::ModuleProfile& by_path(const FlopsProfiler& p,
                                                   const std::string& path) {
  for (const auto& m : p.modules())
    if (m.path == path) return m;
  throw std::runtime_error("no module '" + path + "' in the profile");
}

// The value printed after `key` on the summary line that starts with it ("{:<70}  {:<8}").
std::string summary_value(const std::string& report, const std::string& key) {
  std::istringstream lines(report);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(key, 0) == 0) {
      std::string v = line.substr(key.size());
      v.erase(0, v.find_first_not_of(' '));
      v.erase(v.find_last_not_of(' ') + 1);
      return v;
    }
  ADD_FAILURE() << "no summary line '" << key << "' in\n" << report;
  return "";
}

// A figure as the summary prints it ("23.94 ms", "1.2 GFLOPS", "119.03", "25.85%"): its value, and
// how far the exact value it was printed from may lie from it (half of the last of 2 decimals in
// the unit's magnitude: DeepSpeed's number_to_string, round(x, 2)).
struct Printed {
  double value = 0, half = 0;
  double low() const { return value - half; }
  double high() const { return value + half; }
};
Printed printed(const std::string& text, const std::string& suffix) {
  std::istringstream in(text);
  double x = 0;
  in >> x;
  std::string unit;
  std::getline(in, unit);
  unit.erase(0, unit.find_first_not_of(' '));
  EXPECT_TRUE(unit.size() >= suffix.size() &&
              unit.compare(unit.size() - suffix.size(), suffix.size(), suffix) == 0)
      << "'" << text << "' does not end in '" << suffix << "'";
  const std::string prefix = unit.substr(0, unit.size() - std::min(unit.size(), suffix.size()));
  const std::map<std::string, double> magnitude = {{"", 1},    {"T", 1e12}, {"G", 1e9}, {"M", 1e6},
                                                   {"K", 1e3}, {"m", 1e-3}, {"u", 1e-6}};
  EXPECT_TRUE(magnitude.count(prefix)) << "'" << text << "'";
  const double m = magnitude.count(prefix) ? magnitude.at(prefix) : 1;
  return {x * m, 0.005 * m * (1 + 1e-9)};
}

// `shown` (a printed figure) equals numerator / d, to its print precision, for some d in
// [over_low, over_high] (a printed latency's interval).
void expect_quotient(const Printed& shown, double numerator, double over_low, double over_high,
                     const std::string& what) {
  ASSERT_GT(over_low, 0) << what;
  EXPECT_GE(shown.high(), numerator / over_high) << what;
  EXPECT_LE(shown.low(), numerator / over_low) << what;
}

TEST(FlopsProfiler, SingleLinearIsTwoTimesInputTimesOut) {
  torch::NoGradGuard no_grad;
  auto lin = torch::nn::Linear(torch::nn::LinearOptions(8, 24));
  auto x = torch::randn({2, 3, 8});
  FlopsProfiler prof(lin.ptr());
  prof.start_profile();
  lin->forward(x);
  prof.stop_profile();
  // x W^T: 2*3 rows of 8 inputs meet 24 outputs. libtorch's C++ Linear runs a 3-D input as
  // matmul then `output += bias`, and that add is an operator that ran: 2*3*24 more.
  EXPECT_EQ(prof.get_total_macs(), 2 * 3 * 8 * 24);
  EXPECT_EQ(prof.get_total_flops(), 2 * 2 * 3 * 8 * 24 + 2 * 3 * 24);
  EXPECT_EQ(prof.get_total_params(), 8 * 24 + 24);
  ASSERT_EQ(prof.modules().size(), 1u);
  EXPECT_EQ(prof.modules()[0].type, "Linear");
  EXPECT_CONTAINS(prof.modules()[0].extra, "in_features=8");
  EXPECT_GT(prof.get_total_duration(), 0.0);
  // Nothing outside start/stop is counted.
  lin->forward(x);
  EXPECT_EQ(prof.get_total_flops(), 2 * 2 * 3 * 8 * 24 + 2 * 3 * 24);
  // at::linear (what F.linear is in Python, and deepspeed::zero::linear calls) is one operator,
  // counted as DeepSpeed counts it: the bias add is left out.
  prof.start_profile();
  at::linear(x, lin->weight, lin->bias);
  prof.stop_profile();
  EXPECT_EQ(prof.get_total_flops(), 2 * 2 * 3 * 8 * 24);
  // A 2-D input runs as addmm: 2 MACs + the bias (numel of addmm's `self`, DeepSpeed's formula).
  prof.start_profile();
  lin->forward(x.reshape({6, 8}));
  prof.stop_profile();
  EXPECT_EQ(prof.get_total_flops(), 2 * 6 * 8 * 24 + 24);
}

struct ChainImpl : torch::nn::Module {
  ChainImpl() {
    a = register_parameter("a", torch::randn({8, 16}));
    b = register_parameter("b", torch::randn({16, 32}));
    c = register_parameter("c", torch::randn({4, 32, 4}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::matmul(x, a);                             // [5, 8] x [8, 16]
    h = h.mm(b);                                              // [5, 16] x [16, 32]
    return torch::bmm(h.unsqueeze(0).expand({4, 5, 32}), c);  // [4, 5, 32] x [4, 32, 4]
  }
  torch::Tensor a, b, c;
};
TORCH_MODULE(Chain);

TEST(FlopsProfiler, MatmulChainIsTheSumOfItsProducts) {
  torch::NoGradGuard no_grad;
  Chain chain;
  FlopsProfiler prof(chain.ptr());
  prof.start_profile();
  chain->forward(torch::randn({5, 8}));
  prof.stop_profile();
  const int64_t macs = 5 * 8 * 16 + 5 * 16 * 32 + 4 * 5 * 32 * 4;
  EXPECT_EQ(prof.get_total_macs(), macs);
  EXPECT_EQ(prof.get_total_flops(), 2 * macs);
  // One count per product: aten::matmul's inner aten::mm is not counted again.
  std::vector<std::string> names;
  for (const auto& op : prof.counted_ops()) names.push_back(op.name);
  EXPECT_EQ(names, (std::vector<std::string>{"aten::matmul", "aten::mm", "aten::bmm"}));
}

// A convolution: (Cin/groups)·prod(k) MACs per output element, 2 FLOPs each, + numel(output) for
// the bias (DeepSpeed's _conv_flops_compute). Conv2d(4, 8, k 3, stride 2, pad 1, groups 2) on
// [2, 4, 5, 5]: output [2, 8, 3, 3] = 144 elements, 18 MACs each.
TEST(FlopsProfiler, Conv2dCountsMacsPerOutputAndTheBias) {
  torch::NoGradGuard no_grad;
  auto conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 8, 3).stride(2).padding(1).groups(2));
  FlopsProfiler prof(conv.ptr());
  prof.start_profile();
  conv->forward(torch::randn({2, 4, 5, 5}));
  prof.stop_profile();
  EXPECT_EQ(prof.get_total_macs(), 144 * 18);
  EXPECT_EQ(prof.get_total_flops(), 2 * 144 * 18 + 144);
}

// A transposed convolution: every input element meets (Cout/groups)·prod(k) weights. Counted
// right, which differs from DeepSpeed's _conv_trans_flops_compute (docs/monitoring.md): it takes
// weight.shape[1] (already Cout/groups) as Cout and divides by groups again, and counts the bias
// over the ordinary convolution's output size. ConvTranspose2d(4, 8, k 3, stride 2, pad 1) on
// [1, 4, 5, 5]: 25 positions · 4·8·9 = 7,200 MACs; output [1, 8, 9, 9] = 648 bias adds: 15,048
// FLOPs (DeepSpeed: 14,400 + 8·3·3 = 14,472). With groups 2, 3,600 MACs (DeepSpeed: 1,800).
TEST(FlopsProfiler, ConvTranspose2dCountsEveryInputTimesItsKernelsAndTheWholeOutputsBias) {
  torch::NoGradGuard no_grad;
  auto deconv =
      torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(4, 8, 3).stride(2).padding(1));
  FlopsProfiler prof(deconv.ptr());
  prof.start_profile();
  auto out = deconv->forward(torch::randn({1, 4, 5, 5}));
  prof.stop_profile();
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{1, 8, 9, 9}));
  EXPECT_EQ(prof.get_total_macs(), 7200);
  EXPECT_EQ(prof.get_total_flops(), 15048);

  auto grouped = torch::nn::ConvTranspose2d(
      torch::nn::ConvTranspose2dOptions(4, 8, 3).stride(2).padding(1).groups(2).bias(false));
  FlopsProfiler grouped_prof(grouped.ptr());
  grouped_prof.start_profile();
  grouped->forward(torch::randn({1, 4, 5, 5}));
  grouped_prof.stop_profile();
  EXPECT_EQ(grouped_prof.get_total_macs(), 25 * 4 * (8 / 2) * 9);
  EXPECT_EQ(grouped_prof.get_total_flops(), 2 * 25 * 4 * (8 / 2) * 9);
}

// einsum has no formula (DeepSpeed's counts torch.einsum itself; libtorch's C++ einsum is not one
// counted operator): what it runs is counted, here the batched product it becomes.
TEST(FlopsProfiler, EinsumCountsTheProductItRuns) {
  torch::NoGradGuard no_grad;
  Chain chain;
  FlopsProfiler prof(chain.ptr());
  prof.start_profile();
  torch::einsum("bij,bjk->bik", {torch::randn({2, 3, 4}), torch::randn({2, 4, 5})});
  prof.stop_profile();
  std::vector<std::string> names;
  for (const auto& op : prof.counted_ops()) names.push_back(op.name);
  EXPECT_EQ(names, (std::vector<std::string>{"aten::bmm"}));
  EXPECT_EQ(prof.get_total_macs(), 2 * 3 * 4 * 5);
  EXPECT_EQ(prof.get_total_flops(), 2 * 2 * 3 * 4 * 5);
}

// interpolate as DeepSpeed's _upsample_flops_compute counts it: prod(size) when a size was given
// (the output's spatial size only), numel(input) with a scale factor (DeepSpeed's scale product is
// computed and dropped), in every mode that runs an upsample operator.
TEST(FlopsProfiler, InterpolateCountsAsDeepSpeedsUpsample) {
  namespace F = torch::nn::functional;
  torch::NoGradGuard no_grad;
  Chain chain;
  FlopsProfiler prof(chain.ptr());
  auto flops_of = [&](const std::function<void()>& run) {
    prof.start_profile();
    run();
    prof.stop_profile();
    return prof.get_total_flops();
  };
  const auto x = torch::randn({2, 3, 4, 5});  // numel 120
  EXPECT_EQ(flops_of([&] {
              F::interpolate(x, F::InterpolateFuncOptions().size(std::vector<int64_t>{8, 10}));
            }),
            8 * 10);
  EXPECT_EQ(flops_of([&] {
              F::interpolate(
                  x, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2, 2}));
            }),
            120);
  EXPECT_EQ(flops_of([&] {
              F::interpolate(x, F::InterpolateFuncOptions()
                                    .size(std::vector<int64_t>{6, 7})
                                    .mode(torch::kBilinear)
                                    .align_corners(false));
            }),
            6 * 7);
  EXPECT_EQ(flops_of([&] {
              F::interpolate(torch::randn({2, 3, 4}), F::InterpolateFuncOptions()
                                                          .scale_factor(std::vector<double>{3})
                                                          .mode(torch::kLinear)
                                                          .align_corners(true));
            }),
            2 * 3 * 4);
  EXPECT_EQ(flops_of([&] {
              torch::nn::Upsample(torch::nn::UpsampleOptions()
                                      .scale_factor(std::vector<double>{2, 2, 2})
                                      .mode(torch::kTrilinear)
                                      .align_corners(false))
                  ->forward(torch::randn({1, 2, 3, 3, 3}));
            }),
            2 * 27);
  std::vector<std::string> names;
  for (const auto& op : prof.counted_ops()) names.push_back(op.name);
  EXPECT_EQ(names, (std::vector<std::string>{"aten::upsample_trilinear3d"}));
}

// The GPT's attention by hand: B batch, T tokens, C channels, h heads.
int64_t attention_flops(int64_t B, int64_t T, int64_t C, int64_t h) {
  return 2 * B * T * C * 3 * C  // qkv projection
         + 2 * B * T * T * C    // q k^T over all heads
         + B * h * T * T        // * 1/sqrt(head_dim)
         + B * h * T * T        // softmax
         + 2 * B * T * T * C    // att v
         + 2 * B * T * C * C;   // output projection
}

TEST(FlopsProfiler, GptAttentionMatchesTheHandCount) {
  torch::NoGradGuard no_grad;
  gpt::GPTConfig c{256, 16, 1, 4, 32};
  gpt::CausalSelfAttention attn(c);
  const int64_t B = 2, T = 8;
  FlopsProfiler prof(attn.ptr());
  prof.start_profile();
  attn->forward(torch::randn({B, T, c.n_embd}));
  prof.stop_profile();
  EXPECT_EQ(prof.get_total_flops(), attention_flops(B, T, c.n_embd, c.n_head));
  EXPECT_EQ(by_path(prof, "qkv").flops, 2 * B * T * c.n_embd * 3 * c.n_embd);
  EXPECT_EQ(by_path(prof, "proj").flops, 2 * B * T * c.n_embd * c.n_embd);
}

// In a block the parameter-free attention work (matmuls, scale, softmax) lands in `attn`, between
// the operators that read attn.qkv's and attn.proj's weights; the MLP's GELU in `mlp`.
TEST(FlopsProfiler, BlockGivesParameterFreeWorkToTheEnclosingModule) {
  torch::NoGradGuard no_grad;
  gpt::GPTConfig c{256, 16, 1, 4, 32};
  gpt::Block block(c);
  const int64_t B = 2, T = 8, C = c.n_embd;
  FlopsProfiler prof(block.ptr());
  prof.start_profile();
  block->forward(torch::randn({B, T, C}));
  prof.stop_profile();
  EXPECT_EQ(by_path(prof, "attn").flops, attention_flops(B, T, C, c.n_head));
  EXPECT_EQ(by_path(prof, "ln1").flops, 5 * B * T * C);
  EXPECT_EQ(by_path(prof, "mlp").flops,
            2 * B * T * C * 4 * C + B * T * 4 * C + 2 * B * T * 4 * C * C);
  // The block adds its two residual sums.
  EXPECT_EQ(prof.get_total_flops(), attention_flops(B, T, C, c.n_head) + 2 * 5 * B * T * C +
                                        2 * B * T * C * 4 * C + B * T * 4 * C +
                                        2 * B * T * 4 * C * C + 2 * B * T * C);
  // Every module's latency lies within its parent's.
  for (const auto& m : prof.modules())
    if (m.parent >= 0) EXPECT_LE(m.latency_s, prof.modules()[m.parent].latency_s + 1e-9) << m.path;
}

// The engine profiles its step `profile_step` and writes DeepSpeed's report; the detailed tree
// names every module of the model, in the model's order.
TEST(FlopsProfiler, EngineReportFollowsTheModelTree) {
  dstest::TempDir dir;
  const std::string out = dir / "prof/flops.txt";
  gpt::GPTConfig mc{256, 16, 2, 2, 32};
  torch::manual_seed(1);
  auto model = std::make_shared<gpt::GPTImpl>(mc);
  auto config = dstest::base_config(2, 1, 0);
  config["flops_profiler"] = {
      {"enabled", true}, {"profile_step", 1}, {"output_file", out}, {"peak_tflops", 1.0}};
  config["steps_per_print"] = 0;
  auto r = deepspeed::initialize<gpt::GPTImpl>({.model = model, .config_json = config});
  auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  for (int step = 0; step < 3; ++step) {
    auto loss = r.engine->forward(x, x);
    r.engine->backward(loss);
    r.engine->step();
    if (step == 0) EXPECT_FALSE(std::ifstream(out).good()) << "profiled before profile_step";
  }
  const std::string report = dstest::read_bytes(out);
  EXPECT_CONTAINS(report,
                  "-------------------------- DeepSpeed Flops Profiler --------------------------");
  // DeepSpeed names the step after its increment: profile_step 1 prints "step 2".
  EXPECT_CONTAINS(report, "Profile Summary at step 2:");
  EXPECT_CONTAINS(report, "params per GPU: ");
  EXPECT_CONTAINS(report, "bwd FLOPS per GPU = 2 * fwd flops per GPU / bwd latency: ");
  EXPECT_CONTAINS(report, "MFU = FLOPS per GPU / peak (1 TFLOPS): ");
  EXPECT_CONTAINS(report, "Aggregated Profile per GPU");
  EXPECT_CONTAINS(report, "depth 0:\n    params      - {'GPT': '");
  EXPECT_CONTAINS(report, "Detailed Profile per GPU");
  // "(name): Type(" lines of the detailed tree, in order, against the model's own modules.
  std::vector<std::string> printed;
  std::istringstream lines(report);
  for (std::string line; std::getline(lines, line);) {
    const auto open = line.find('(');
    const auto close = line.find("): ");
    if (open != std::string::npos && close != std::string::npos && open < close &&
        line.find_first_not_of(' ') == open)
      printed.push_back(line.substr(open + 1, close - open - 1));
  }
  std::vector<std::string> expected;
  std::function<void(torch::nn::Module&)> walk = [&](torch::nn::Module& m) {
    for (auto& kv : m.named_children()) {
      expected.push_back(kv.key());
      walk(*kv.value());
    }
  };
  walk(*model);
  EXPECT_EQ(printed, expected);
  EXPECT_CONTAINS(report, "GPT(\n  ");
  EXPECT_CONTAINS(report, "(block0): ZeroUnit<Block>(");
  EXPECT_CONTAINS(report, "(qkv): Linear(");
  EXPECT_CONTAINS(report, "in_features=32, out_features=96");
}

// Every derived figure of the summary, from facts given by hand: 10 M forward FLOPs (at::linear,
// 2 * 50,000 inputs * 100 outputs) and 5,100 parameters per GPU, 4 model-parallel ranks, latencies
// 4 ms forward, 16 ms backward, 5 ms step, recompute_fwd_factor 0.5, 48 samples per iteration,
// a peak of 0.01 TFLOPS. The formulas are DeepSpeed's print_model_profile (the MFU line ours,
// docs/monitoring.md); values worked out by hand.
TEST(FlopsProfiler, SummaryFiguresFollowDeepSpeedsFormulas) {
  torch::NoGradGuard no_grad;
  auto lin = torch::nn::Linear(torch::nn::LinearOptions(50, 100));
  FlopsProfiler prof(lin.ptr());
  prof.start_profile();
  at::linear(torch::randn({10, 100, 50}), lin->weight, lin->bias);
  prof.stop_profile();
  ASSERT_EQ(prof.get_total_flops(), 10000000);
  ASSERT_EQ(prof.get_total_params(), 5100);
  deepspeed::profiling::RunFacts f;
  f.from_engine = true;
  f.world_size = 8;
  f.dp_size = 2;
  f.mp_size = 4;
  f.micro_batch_size = 3;
  f.fwd_latency_s = 0.004;
  f.bwd_latency_s = 0.016;
  f.step_latency_s = 0.005;
  f.samples_per_iter = 48;
  f.recompute_fwd_factor = 0.5;
  f.peak_tflops = 0.01;
  const std::string report = prof.model_profile({}, f);
  auto value = [&](const std::string& key) { return summary_value(report, key); };
  EXPECT_EQ(value("world size: "), "8");
  EXPECT_EQ(value("data parallel size: "), "2");
  EXPECT_EQ(value("model parallel size: "), "4");
  EXPECT_EQ(value("batch size per GPU: "), "3");
  EXPECT_EQ(value("params per GPU: "), "5.1 K");
  EXPECT_EQ(value("params of model = params per GPU * mp_size: "), "20.4 K");  // 5,100 * 4
  EXPECT_EQ(value("fwd flops per GPU: "), "10 M");
  EXPECT_EQ(value("fwd flops of model = fwd flops per GPU * mp_size: "), "40 M");
  EXPECT_EQ(value("fwd latency: "), "4 ms");
  EXPECT_EQ(value("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: "), "2.5 GFLOPS");
  EXPECT_EQ(value("bwd latency: "), "16 ms");
  // (2 + 0.5) * 10 M / 16 ms
  EXPECT_EQ(value("bwd FLOPS per GPU = 2.5 * fwd flops per GPU / bwd latency: "), "1.56 GFLOPS");
  // 3.5 * 10 M / 20 ms
  EXPECT_EQ(value("fwd+bwd FLOPS per GPU = 3.5 * fwd flops per GPU / (fwd+bwd latency): "),
            "1.75 GFLOPS");
  EXPECT_EQ(value("step latency: "), "5 ms");
  EXPECT_EQ(value("iter latency: "), "25 ms");
  EXPECT_EQ(value("FLOPS per GPU = 3.5 * fwd flops per GPU / iter latency: "), "1.4 GFLOPS");
  EXPECT_EQ(value("samples/second: "), "1920.0");  // 48 / 25 ms, as Python prints round(x, 2)
  // 1.4 GFLOPS of a 0.01 TFLOPS (10 GFLOPS) peak: 14%.
  EXPECT_EQ(value("MFU = FLOPS per GPU / peak (0.01 TFLOPS): "), "14%");

  // Standalone (no engine): DeepSpeed's params of model is 0 there, the flops of model the GPU's.
  const std::string alone = prof.model_profile();
  EXPECT_EQ(summary_value(alone, "params of model = params per GPU * mp_size: "), "0");
  EXPECT_EQ(summary_value(alone, "fwd flops of model = fwd flops per GPU * mp_size: "), "10 M");
  EXPECT_EQ(alone.find("\nbwd latency: "), std::string::npos);  // no timers: no backward lines
}

// The engine's summary at gradient accumulation 2: each derived figure equals its formula over the
// latencies the report prints (to the precision they are printed with) and the forward FLOPs of
// both micro-steps counted independently; samples/second is the step's train_batch_size (2
// micro-batches of 2 on one rank) over the iteration latency. (DeepSpeed's numerator is
// micro_batch * world_size, one micro-step's samples: the same figure without accumulation and
// model parallelism.)
TEST(FlopsProfiler, EngineSummaryFiguresFollowFromItsLatencies) {
  dstest::TempDir dir;
  const std::string out = dir / "flops.txt";
  gpt::GPTConfig mc{256, 16, 2, 2, 32};
  auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  auto plain = std::make_shared<gpt::GPTImpl>(mc);
  FlopsProfiler alone(plain);
  alone.start_profile();
  plain->forward(x, x);
  alone.stop_profile();
  const double flops = 2.0 * alone.get_total_flops();  // both micro-steps' forwards

  torch::manual_seed(1);
  auto model = std::make_shared<gpt::GPTImpl>(mc);
  auto config = dstest::base_config(2, 2, 0);
  // peak 1 GFLOPS keeps the MFU well above its 0.01 print precision on a CPU.
  config["flops_profiler"] = {{"enabled", true},
                              {"profile_step", 1},
                              {"output_file", out},
                              {"recompute_fwd_factor", 0.5},
                              {"peak_tflops", 0.001}};
  auto r = deepspeed::initialize<gpt::GPTImpl>({.model = model, .config_json = config});
  for (int micro = 0; micro < 6; ++micro) {
    r.engine->backward(r.engine->forward(x, x));
    r.engine->step();
  }
  const std::string report = dstest::read_bytes(out);
  auto value = [&](const std::string& key) { return summary_value(report, key); };
  EXPECT_EQ(value("batch size per GPU: "), "2");
  EXPECT_EQ(value("fwd flops per GPU: "), deepspeed::profiling::number_to_string(flops));
  const Printed fwd = printed(value("fwd latency: "), "s");
  const Printed bwd = printed(value("bwd latency: "), "s");
  const Printed step = printed(value("step latency: "), "s");
  const Printed iter = printed(value("iter latency: "), "s");
  const std::string table = "\n" + report.substr(0, report.find("Aggregated"));
  // iter = fwd + bwd + step
  EXPECT_LE(iter.low(), fwd.high() + bwd.high() + step.high()) << table;
  EXPECT_GE(iter.high(), fwd.low() + bwd.low() + step.low()) << table;
  expect_quotient(printed(value("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: "), "FLOPS"),
                  flops, fwd.low(), fwd.high(), "fwd FLOPS" + table);
  expect_quotient(
      printed(value("bwd FLOPS per GPU = 2.5 * fwd flops per GPU / bwd latency: "), "FLOPS"),
      2.5 * flops, bwd.low(), bwd.high(), "bwd FLOPS" + table);
  expect_quotient(
      printed(value("fwd+bwd FLOPS per GPU = 3.5 * fwd flops per GPU / (fwd+bwd latency): "),
              "FLOPS"),
      3.5 * flops, fwd.low() + bwd.low(), fwd.high() + bwd.high(), "fwd+bwd FLOPS" + table);
  const Printed achieved =
      printed(value("FLOPS per GPU = 3.5 * fwd flops per GPU / iter latency: "), "FLOPS");
  expect_quotient(achieved, 3.5 * flops, iter.low(), iter.high(), "FLOPS per GPU" + table);
  expect_quotient(printed(value("samples/second: "), ""), 4.0, iter.low(), iter.high(),
                  "samples/second" + table);
  // MFU = 100 * FLOPS per GPU / 1e9, in percent.
  const Printed mfu = printed(value("MFU = FLOPS per GPU / peak (0.001 TFLOPS): "), "%");
  expect_quotient(mfu, 100 * 3.5 * flops / 1e9, iter.low(), iter.high(), "MFU" + table);
}

TEST(FlopsProfiler, EngineCountsEqualAStandaloneProfile) {
  // Same model, same batch: the engine's forward count equals one taken by hand (the per-module
  // FLOPs of a full GPT: 2 blocks of attention + MLP, embeddings 0, head, loss not counted).
  gpt::GPTConfig mc{256, 16, 2, 2, 32};
  auto model = std::make_shared<gpt::GPTImpl>(mc);
  auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  FlopsProfiler prof(model);
  prof.start_profile();
  model->forward(x, x);
  prof.stop_profile();
  const int64_t B = 2, T = 16, C = 32, h = 2, V = 256;
  const int64_t block = attention_flops(B, T, C, h) + 2 * 5 * B * T * C + 2 * B * T * C * 4 * C +
                        B * T * 4 * C + 2 * B * T * 4 * C * C + 2 * B * T * C;
  const int64_t total = B * T * C                    // token + position embeddings added
                        + 2 * block + 5 * B * T * C  // ln_f
                        + 2 * B * T * C * V;         // head
  EXPECT_EQ(prof.get_total_flops(), total);
  EXPECT_EQ(by_path(prof, "block1.attn").flops, attention_flops(B, T, C, h));
  EXPECT_EQ(prof.get_total_params(), model->num_parameters());
}

// Under every ZeRO stage the engine's profile gives each module the same MACs as a profile of the
// plain model: ZeRO 1/2 keep the parameters as views into one flat buffer, ZeRO-3 gathers each
// block's parameters into new memory before it runs; the owners are found either way. Parameters
// are counted at full size (ZeRO-3 holds only a partition).
class FlopsProfilerStages : public testing::TestWithParam<int> {};

TEST_P(FlopsProfilerStages, EngineMacsPerModuleEqualThePlainModels) {
  gpt::GPTConfig mc{256, 16, 2, 2, 32};
  auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  auto plain = std::make_shared<gpt::GPTImpl>(mc);
  FlopsProfiler prof(plain);
  prof.start_profile();
  plain->forward(x, x);
  prof.stop_profile();
  std::vector<std::string> expected;
  for (const auto& m : prof.modules())
    expected.push_back(deepspeed::profiling::macs_to_string(m.macs));

  dstest::TempDir dir;
  const std::string out = dir / "flops.txt";
  auto model = std::make_shared<gpt::GPTImpl>(mc);
  auto config = dstest::base_config(2, 2, GetParam());  // 2 micro-steps: both forwards count
  config["flops_profiler"] = {{"enabled", true}, {"profile_step", 0}, {"output_file", out}};
  config["steps_per_print"] = 0;
  auto r = deepspeed::initialize<gpt::GPTImpl>({.model = model, .config_json = config});
  for (int micro = 0; micro < 2; ++micro) {
    r.engine->backward(r.engine->forward(x, x));
    r.engine->step();
  }
  const std::string report = dstest::read_bytes(out);
  std::vector<std::string> twice;
  for (const auto& m : prof.modules())
    twice.push_back(deepspeed::profiling::macs_to_string(2 * m.macs));
  EXPECT_EQ(dstest::macs_column(report), twice);
  EXPECT_CONTAINS(report,
                  "params per GPU:                                                         " +
                      deepspeed::profiling::params_to_string(plain->num_parameters()));
  EXPECT_CONTAINS(report,
                  "fwd MACs per GPU:                                                       " +
                      deepspeed::profiling::macs_to_string(2 * prof.get_total_macs()));
}
INSTANTIATE_TEST_SUITE_P(Stages, FlopsProfilerStages, testing::Values(0, 1, 2, 3));

TEST(FlopsProfiler, ConfigNamesBadKeysAndValues) {
  auto doc = [](json block) {
    return json{{"train_micro_batch_size_per_gpu", 1}, {"flops_profiler", block}};
  };
  std::vector<std::string> warnings;
  deepspeed::parse_config(doc({{"enabled", true}, {"profile_stpe", 3}}), 1, {}, &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_CONTAINS(warnings[0], "flops_profiler.profile_stpe");
  EXPECT_CONTAINS(warnings[0], "flops_profiler.profile_step");
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, json>>{{"module_depth", -2},
                                                 {"top_modules", 0},
                                                 {"peak_tflops", -1.0},
                                                 {"recompute_fwd_factor", -0.5},
                                                 {"profile_step", -1}}) {
    try {
      deepspeed::parse_config(doc({{key, value}}), 1);
      ADD_FAILURE() << key << " accepted";
    } catch (const deepspeed::ConfigError& e) {
      EXPECT_CONTAINS(std::string(e.what()), "flops_profiler." + key);
    }
  }
  auto c = deepspeed::parse_config(doc({{"enabled", true}, {"peak_tflops", 312}}), 1);
  EXPECT_EQ(c.flops_profiler.peak_tflops, 312.0);
  EXPECT_TRUE(c.wall_clock_breakdown);
}

TEST(FlopsProfiler, NumbersFormatAsDeepSpeeds) {
  using namespace deepspeed::profiling;
  EXPECT_EQ(number_to_string(0), "0 ");
  EXPECT_EQ(flops_to_string(1234567), "1.23 MFLOPS");
  EXPECT_EQ(macs_to_string(2.5e9), "2.5 GMACs");
  EXPECT_EQ(params_to_string(1.5e9), "1.5 B");
  EXPECT_EQ(params_to_string(512), "512");
  EXPECT_EQ(duration_to_string(0.01234), "12.34 ms");
}

}  // namespace

}  // namespace flops_profiler_test
