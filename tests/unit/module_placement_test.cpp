// Where initialize() puts the module (runtime/module_placement.h): at stage 3 the units' trainable
// parameters are left for zero::Stage3 to move one unit at a time; everything else moves at once.
// The move itself needs a GPU (tests/gpu: OneGpuMemory.Stage3InitializeHoldsOneUnitAtATime); which
// parameters stage 3 takes over is checked here, on the example GPT.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <set>
#include <string>

#include "gpt/model.h"
#include "runtime/module_placement.h"

namespace module_placement_test {

namespace {
std::set<const void*> keys(const std::vector<at::Tensor>& ts) {
  std::set<const void*> out;
  for (const auto& t : ts) out.insert(t.unsafeGetTensorImpl());
  return out;
}
}  // namespace

// The blocks' (ZeroUnits') trainable parameters, each once; not the embeddings, the final norm or
// the head (outside every unit: they move with the module), nor a frozen block parameter (no
// stage holds it: it moves with the module too).
TEST(ModulePlacement, StageThreeMovesTheUnitsTrainableParameters) {
  gpt::GPTConfig c;
  c.n_layer = 3;
  c.n_embd = 32;
  c.n_head = 2;
  c.block_size = 16;
  gpt::GPT model(c);
  const std::string frozen = "block1.ln1.weight";
  model->named_parameters()[frozen].set_requires_grad(false);
  std::set<const void*> expected;
  for (const auto& item : model->named_parameters())
    if (item.key().rfind("block", 0) == 0 && item.key() != frozen)
      expected.insert(item.value().unsafeGetTensorImpl());
  ASSERT_GT(expected.size(), 3u);
  const auto moved = deepspeed::parameters_stage3_moves(*model);
  EXPECT_EQ(moved.size(), expected.size()) << "each parameter once";
  EXPECT_EQ(keys(moved), expected);
}

}  // namespace module_placement_test
