#include "support/resume_alike.h"

#include <gtest/gtest.h>

#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"

namespace dstest {

void expect_resumed_alike(const ResumeAlike& spec) {
  TempDir waiting_dir, overlapped_dir;
  auto job = [&](bool overlap) {
    CheckpointJob j;
    j.world_size = spec.world_size;
    j.config = spec.config(overlap);
    return j;
  };
  auto save = [&](const std::string& dir, bool overlap) {
    CheckpointJob j = job(overlap);
    j.steps = spec.save_after;
    j.save_dir = dir;
    j.save_at_end = true;
    return run_checkpoint_job(j);
  };
  EXPECT_EQ(save(overlapped_dir.path(), true).losses, save(waiting_dir.path(), false).losses);
  if (spec.check_saved) spec.check_saved(waiting_dir.path(), overlapped_dir.path());
  auto resume = [&](const std::string& dir, bool overlap) {
    CheckpointJob j = job(overlap);
    j.steps = spec.resume_to;
    j.model_seed = 99;  // loading must win
    j.load_dir = dir;
    return run_checkpoint_job(j);
  };
  const auto waiting = resume(waiting_dir.path(), false);
  const auto overlapped = resume(overlapped_dir.path(), true);
  EXPECT_EQ(overlapped.losses, waiting.losses);
  EXPECT_TRUE(bit_identical(overlapped.weights, waiting.weights)) << "resumed weights differ";
}

ResumedMidway expect_resumed_midway_bit_for_bit(CheckpointJob job, const std::string& save_dir,
                                                int split, int total) {
  ResumedMidway out;
  job.steps = total;
  out.whole = run_checkpoint_job(job);
  if (out.whole.losses.size() != static_cast<size_t>(total)) {
    ADD_FAILURE() << "the whole run took " << out.whole.losses.size() << " steps, not " << total;
    return out;
  }
  job.steps = split;
  job.save_dir = save_dir;
  job.save_at_end = true;
  run_checkpoint_job(job);
  out.resume = job;
  out.resume.save_dir.clear();
  out.resume.save_at_end = false;
  out.resume.steps = total;
  out.resume.model_seed = job.model_seed + 1;  // loading must win
  out.resume.load_dir = save_dir;
  out.resumed = run_checkpoint_job(out.resume);
  const std::vector<double> after_split(out.whole.losses.begin() + split, out.whole.losses.end());
  EXPECT_EQ(out.resumed.losses, after_split);
  EXPECT_TRUE(bit_identical(out.resumed.weights, out.whole.weights)) << "resumed weights differ";
  return out;
}

}  // namespace dstest
