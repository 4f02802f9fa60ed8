// Linear partitioning: contiguous non-empty layers per stage, as DeepSpeed's
// runtime/utils.py partition_balanced (0.14 on) cuts them, so a model splits into the same stages.
#include <algorithm>
#include <limits>

#include "deepspeed/errors.h"
#include "deepspeed/pipe.h"

namespace deepspeed {
namespace pipe {

namespace {

void check_stage_count(int64_t layers, int stages) {
  if (stages < 1) throw ConfigError("pipeline: num_stages = " + std::to_string(stages) + " must be >= 1");
  if (stages > layers)
    throw ConfigError("pipeline: num_stages = " + std::to_string(stages) + " is more than the " +
                      std::to_string(layers) +
                      " layers of the PipelineModule (each stage needs a layer)");
}

}  // namespace

// DeepSpeed's dynamic programme over (first i layers, j parts): cost[i][j] = the smallest spread
// (heaviest minus lightest part) of a cut of the first i layers into j parts, with that cut's
// heaviest and lightest sums in most[i][j] and least[i][j]. It minimises the spread, not the
// heaviest part, and each (i, j) takes the LAST previous cut k of the smallest cost (the `>=`):
// 7 equal layers over 3 stages are 3, 2, 2 (the heaviest-part rule with the first cut gave
// 2, 2, 3), and the ties decide where zero-weight layers (unmatched by "type:") go. Doubles with
// +inf for "no cut yet", as DeepSpeed's numpy arrays: an unreachable (k, j - 1) gives cost inf,
// which `>=` still accepts until a finite cost replaces it; std::max/std::min pick like Python's
// max/min. O(stages * layers^2), fine for a few hundred layers. Same answer on every rank.
Partition partition_balanced(const std::vector<int64_t>& weights, int stages) {
  const int n = static_cast<int>(weights.size());
  check_stage_count(n, stages);  // fewer layers than stages: DeepSpeed leaves stages empty
  if (n == stages) return partition_uniform(n, stages);  // one layer each, as DeepSpeed
  const int m = stages;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> prefix(n + 1, 0.0);
  int64_t sum = 0;  // summed in integers, as numpy's cumsum of the counts, then made a double
  for (int i = 0; i < n; ++i) prefix[i + 1] = static_cast<double>(sum += weights[i]);
  using Table = std::vector<std::vector<double>>;
  Table most(n + 1, std::vector<double>(m + 1, inf)), least = most, cost = most;
  std::vector<std::vector<int>> cut(n + 1, std::vector<int>(m + 1, 0));
  most[0][0] = 0;
  cost[0][0] = 0;  // least[0][0] stays inf: no part yet
  for (int i = 1; i <= n; ++i)
    for (int j = 1; j <= std::min(i, m); ++j)
      for (int k = 0; k < i; ++k) {
        const double part = prefix[i] - prefix[k];
        const double hi = std::max(most[k][j - 1], part), lo = std::min(least[k][j - 1], part);
        const double c = hi - lo;
        if (cost[i][j] >= c) {
          cost[i][j] = c;
          most[i][j] = hi;
          least[i][j] = lo;
          cut[i][j] = k;
        }
      }
  Partition p;
  p.bounds.assign(m + 1, 0);
  p.bounds[m] = n;
  for (int j = m; j > 0; --j) p.bounds[j - 1] = cut[p.bounds[j]][j];
  return p;
}

// DeepSpeed's partition_uniform: the remainder one layer each to the first stages.
Partition partition_uniform(int64_t layers, int stages) {
  check_stage_count(layers, stages);
  Partition p;
  p.bounds.assign(stages + 1, 0);
  const int64_t chunk = layers / stages, extra = layers % stages;
  for (int k = 1; k <= stages; ++k) p.bounds[k] = p.bounds[k - 1] + chunk + (k <= extra ? 1 : 0);
  return p;
}

}  // namespace pipe
}  // namespace deepspeed
