// Checkpoints of 16-bit masters make no copy of the whole optimizer state: the checkpoint files
// hold fp32 masters and moments as always, but each piece is widened as the writer appends it and
// rounded as the reader fills it, straight from and into the state where it lives
// (zero/shard_optimizer.cpp's windows). Until 2026-12-05 a save and a load each made fp32 copies
// of the masters and moments first, 12 bytes an element of the partition in host memory at once.
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/training_run.h"
#include "util/allocation_meter.h"

namespace low_precision_checkpoint_memory_test {
namespace {

using json = nlohmann::json;

// One rank at stage 1 with bf16 masters and fp32 moments (the CPU Adam: offload_optimizer "cpu").
json config() {
  json c = dstest::base_config(2, 1, 1);
  c["bf16"] = {{"enabled", true}, {"bf16_master_weights_and_grads", true}};
  c["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  c["steps_per_print"] = 0;
  return c;
}

// Four layers of width 128: about 0.86M parameters, none larger than 65536 elements.
const gpt::GPTConfig kModel{256, 16, 4, 2, 128};

}  // namespace

// The CPU allocation meter around save_checkpoint and load_checkpoint: each allocates less than 4
// bytes an element of the partition (a piece widened at a time, the largest parameter's 256 KiB),
// where the whole fp32 copies were 12. The loaded run then steps as the saved one, bit for bit.
TEST(LowPrecisionCheckpointMemory, SaveAndLoadCopyAPieceAtATime) {
  dstest::TempDir dir;
  auto saved = dstest::make_single_engine(config(), kModel);
  saved.train(2);
  const int64_t psi = dstest::count_parameters(kModel);
  int64_t save_bytes = 0, load_bytes = 0;
  {
    deepspeed::util::AllocationMeter meter;
    saved.engine->save_checkpoint(dir.path(), "two");
    save_bytes = meter.peak_bytes();
  }
  auto loaded = dstest::make_single_engine(config(), kModel, /*seed=*/11);
  loaded.train(1);  // its own weights and state, to be replaced
  {
    deepspeed::util::AllocationMeter meter;
    loaded.engine->load_checkpoint(dir.path(), "two");
    load_bytes = meter.peak_bytes();
  }
  std::cout << "allocated at the peak of a save " << save_bytes << " bytes, of a load "
            << load_bytes << " (" << psi << " parameters; whole fp32 copies: " << 12 * psi
            << ")\n";
  EXPECT_LT(save_bytes, 4 * psi) << "the save copied the optimizer state whole";
  EXPECT_LT(load_bytes, 4 * psi) << "the load copied the optimizer state whole";
  EXPECT_TRUE(dstest::bit_identical(saved.weights(), loaded.weights()));
  // The next step on one batch: the masters, moments and step count came back.
  auto batch = saved.loader->next();
  for (auto* run : {&saved, &loaded}) {
    run->engine->backward(run->engine->forward(batch.data, batch.target));
    run->engine->step();
  }
  EXPECT_TRUE(dstest::bit_identical(saved.weights(), loaded.weights()));
}

}  // namespace low_precision_checkpoint_memory_test
