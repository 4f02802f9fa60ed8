// The checkpoint half of the overlap tests (an update or a gather still in flight when
// save_checkpoint runs right after step()): a run that waits and a run that overlaps each save at
// their end, then each is resumed from its own checkpoint; both pairs must train alike.
#pragma once
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "support/checkpoint_run.h"

namespace dstest {

struct ResumeAlike {
  int world_size = 1;
  std::function<nlohmann::json(bool overlap)> config;  // the waiting run's (false) and the other's
  int save_after = 3;  // steps of the saving jobs
  int resume_to = 6;   // global step the resumed jobs train to (from another model seed)
  // Called on the two save folders (waiting, overlapped) before the resumed jobs run.
  std::function<void(const std::string&, const std::string&)> check_saved;
};

// Checks (gtest) equal losses of the saving jobs, and equal losses and bit-identical weights of
// the resumed ones.
void expect_resumed_alike(const ResumeAlike& spec);

// One job saved midway and resumed: `job` trained whole to `total` steps, then to `split` saving
// at its end into `save_dir`, then loaded from there (another model seed) and trained to
// `total`. Checks (gtest) that the resumed losses and final weights equal the whole run's.
// Returns the resume job (a test loads the same checkpoint under other configs with it) and
// both results.
struct ResumedMidway {
  CheckpointJob resume;
  CheckpointJobResult whole, resumed;
};
ResumedMidway expect_resumed_midway_bit_for_bit(CheckpointJob job, const std::string& save_dir,
                                                int split = 2, int total = 4);

}  // namespace dstest
