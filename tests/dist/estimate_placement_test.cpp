// estimate_zero_memory given the run's placement (deepspeed/memory.h's ZeroMemoryOptions) against
// what memory_report() measures after training over two ranks on this CPU build, where every
// byte is host memory: DeepSpeed's low-precision masters (the 16-bit partition as master, or a
// copy of it where the partition is partly in a file), the NVMe optimizer swap's ring of
// sub-group buffers and its file, stage 3's gradient and parameter files, the moments of
// optimizers other than Adam and the 1-bit optimizers' error feedback.
#include <gtest/gtest.h>

#include <cstdlib>
#include <ostream>
#include <string>

#include "deepspeed/config.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/memory.h"
#include "support/files.h"
#include "support/training_run.h"

namespace estimate_placement_test {
namespace {

struct Placement {
  int stage;
  const char* optimizer;  // offload_optimizer.device
  const char* param;      // offload_param.device (stage 3)
  bool bf16_masters = false, bf16_moments = false;
  int64_t max_in_cpu = 1000000000;  // offload_param.max_in_cpu
  const char* type = "AdamW";       // optimizer.type
  double momentum = 0;              // SGD's optimizer.params.momentum
};

Placement with_optimizer(Placement p, const char* type, double momentum = 0) {
  p.type = type;
  p.momentum = momentum;
  return p;
}

std::string name_of(const Placement& p) {
  return "stage " + std::to_string(p.stage) + ", optimizer " + p.optimizer + ", parameters " +
         p.param + (p.bf16_masters ? ", bf16 masters" : "") +
         (p.bf16_moments ? ", bf16 moments" : "") +
         (p.max_in_cpu < 1000000000 ? ", max_in_cpu " + std::to_string(p.max_in_cpu) : "") + ", " +
         p.type + (p.momentum != 0 ? " with momentum" : "");
}

void PrintTo(const Placement& p, std::ostream* os) { *os << name_of(p); }

bool is_onebit(const Placement& p) {
  const std::string type = p.type;
  return type == "OneBitAdam" || type == "ZeroOneAdam" || type == "OneBitLamb";
}

constexpr int64_t kSubGroup = 30000;
constexpr int kOptimizerBuffers = 2;

nlohmann::json config(const Placement& p, const std::string& dir) {
  auto c = dstest::base_config(2, 1, p.stage);
  c["bf16"] = {{"enabled", true}};
  if (p.bf16_masters) c["bf16"]["bf16_master_weights_and_grads"] = true;
  if (p.bf16_moments) c["bf16"]["bf16_optimizer_states"] = true;
  auto& z = c["zero_optimization"];
  z["offload_optimizer"] = {{"device", p.optimizer}};
  if (std::string(p.optimizer) == "nvme") {
    z["offload_optimizer"]["nvme_path"] = dir;
    z["offload_optimizer"]["buffer_count"] = kOptimizerBuffers;
    z["sub_group_size"] = kSubGroup;
  }
  if (p.stage == 3) {
    z["stage3_param_persistence_threshold"] = 0;
    z["offload_param"] = {{"device", p.param}};
    if (std::string(p.param) == "nvme")
      z["offload_param"].update({{"nvme_path", dir}, {"max_in_cpu", p.max_in_cpu}});
  }
  c["aio"] = {{"block_size", 8192}, {"queue_depth", 4}};
  if (std::string(p.type) != "AdamW") {  // base_config's is AdamW
    c["optimizer"] = {{"type", p.type}, {"params", {{"lr", 1e-3}}}};
    if (p.momentum != 0) c["optimizer"]["params"]["momentum"] = p.momentum;
  }
  if (is_onebit(p)) {
    // Compressed steps from the second (0/1 Adam's phase 2 with its local updates), so that the
    // run holds all the state the estimate counts. 1-bit Lamb refuses bf16 (DeepSpeed asks for
    // a dynamic loss scale) and this CPU libtorch has no fp16 LayerNorm: fp32.
    auto& params = c["optimizer"]["params"];
    params["eps"] = 1e-4;
    params[std::string(p.type) == "ZeroOneAdam" ? "var_freeze_step" : "freeze_step"] =
        std::string(p.type) == "ZeroOneAdam" ? 0 : 1;
    if (std::string(p.type) == "OneBitLamb") c.erase("bf16");
  }
  return c;
}

// Within 2% and `slack` bytes (the measured partitions are cut per unit at stage 3, each file
// slice on 4096 bytes).
void expect_close(int64_t measured, int64_t estimated, int64_t slack, const char* what) {
  EXPECT_LE(std::llabs(measured - estimated), estimated / 50 + slack)
      << what << ": measured " << measured << ", estimated " << estimated;
}

}  // namespace

class EstimatedPlacement : public ::testing::TestWithParam<Placement> {};

TEST_P(EstimatedPlacement, MatchesTheMemoryReport) {
  const Placement p = GetParam();
  SCOPED_TRACE(name_of(p));
  dstest::TempDir dir;
  dstest::RunSpec s;
  s.world_size = 2;
  s.steps = 2;
  s.model = gpt::GPTConfig{256, 16, 2, 2, 128};  // Ψ about 0.46M: the files' padding is small
  s.config = config(p, dir.path());
  const auto r = dstest::train_gpt(s);
  const int64_t psi = dstest::count_parameters(s.model);
  // The estimate of the run's own config, read as initialize() reads it (zero_memory_options).
  const auto e = deepspeed::estimate_zero_memory(
      psi, deepspeed::zero_memory_options(deepspeed::parse_config(s.config, 2), 2));
  // Stage 3 cuts its partition per unit (the example GPT here: fewer than 16 units), each slice
  // of the parameter and gradient files on 4096 bytes.
  const int64_t slack = p.stage == 3 ? 2 * 16 * 4096 : 4096;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const auto& m = r.memory[rank];
    expect_close(m.optimizer_states, e.optimizer_states, slack, "optimizer states");
    expect_close(m.parameters, e.parameters, slack, "parameters");
    expect_close(m.nvme_bytes, e.nvme_bytes, slack, "NVMe");
    // Swapped stage-3 gradients are held a unit at a time (the estimate needs the largest unit
    // for them): compared where they are a partition.
    if (!(p.stage == 3 && std::string(p.optimizer) == "nvme"))
      expect_close(m.gradients, e.gradients, slack, "gradients");
    EXPECT_EQ(m.host_bytes, m.total());  // this CPU build: all of it host memory
  }
}

INSTANTIATE_TEST_SUITE_P(
    Placements, EstimatedPlacement,
    ::testing::Values(
        // Low-precision masters: the partition itself (8 or 4 bytes an element)...
        Placement{1, "cpu", "none", true, false}, Placement{2, "none", "none", true, true},
        Placement{3, "cpu", "cpu", true, true},
        // ... the NVMe swap's ring and file in each state format, at each stage...
        Placement{1, "nvme", "none"}, Placement{2, "nvme", "none", true, false},
        Placement{3, "nvme", "none", true, true}, Placement{3, "nvme", "cpu"},
        // ... and stage 3's parameters on "nvme" within max_in_cpu: all in memory, no file of
        // theirs (a partition beyond it, whole units in memory, is the unit test's).
        Placement{3, "nvme", "nvme"},
        // Optimizers other than Adam keep their own moments: Lion's one, SGD's momentum buffer
        // or none, Adagrad's sum; beside fp32 masters of the bf16 model (a widened step).
        with_optimizer({2, "cpu", "none"}, "Lion"), with_optimizer({1, "none", "none"}, "SGD", 0.9),
        with_optimizer({3, "cpu", "cpu"}, "SGD"), with_optimizer({2, "none", "none"}, "Adagrad"),
        // The 1-bit optimizers (stage 0): Adam's moments and their error feedback; 0/1 Adam's
        // local updates and synchronised parameters; 1-bit Lamb's fresh variance (fp32).
        with_optimizer({0, "none", "none"}, "OneBitAdam"),
        with_optimizer({0, "none", "none"}, "ZeroOneAdam"),
        with_optimizer({0, "none", "none"}, "OneBitLamb")));

}  // namespace estimate_placement_test
