// The benchmarks' timing rule: the best of `reps` wall times of fn(), in seconds, after one
// untimed warm-up call (the first call pays page faults and lazy initialisation).
#pragma once
#include <algorithm>
#include <chrono>

template <typename Fn>
double best_seconds(int reps, Fn&& fn) {
  using Clock = std::chrono::steady_clock;
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}
