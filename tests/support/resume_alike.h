// The checkpoint half of the overlap tests (an update or a gather still in flight when
// save_checkpoint runs right after step()): a run that waits and a run that overlaps each save at
// their end, then each is resumed from its own checkpoint; both pairs must train alike.
#pragma once
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

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

}  // namespace dstest
