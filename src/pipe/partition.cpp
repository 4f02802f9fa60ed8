// Linear partitioning: contiguous layers per stage, the largest stage as light as possible.
#include <algorithm>
#include <limits>

#include "deepspeed/errors.h"
#include "deepspeed/pipe.h"

namespace deepspeed {
namespace pipe {

// Dynamic programme over (layers, parts): best[k][i] = the smallest achievable maximum part sum
// when the first i layers form k non-empty parts. O(stages * layers^2), fine for the few hundred
// layers a model has. Ties keep the earliest cut, so zero-weight layers (unmatched by "type:")
// fall to the later stage deterministically on every rank.
Partition partition_balanced(const std::vector<int64_t>& weights, int stages) {
  const int n = static_cast<int>(weights.size());
  if (stages < 1) throw ConfigError("pipeline: num_stages = " + std::to_string(stages) + " must be >= 1");
  if (stages > n)
    throw ConfigError("pipeline: num_stages = " + std::to_string(stages) + " is more than the " +
                      std::to_string(n) + " layers of the PipelineModule (each stage needs a layer)");
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weights[i];
  const int64_t inf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(stages + 1, std::vector<int64_t>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k)
    for (int i = k; i <= n; ++i)
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == inf) continue;
        const int64_t v = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (v < best[k][i]) {
          best[k][i] = v;
          cut[k][i] = j;
        }
      }
  Partition p;
  p.bounds.assign(stages + 1, 0);
  p.bounds[stages] = n;
  for (int k = stages, i = n; k > 0; --k) {
    i = cut[k][i];
    p.bounds[k - 1] = i;
  }
  return p;
}

Partition partition_uniform(int64_t layers, int stages) {
  if (stages < 1) throw ConfigError("pipeline: num_stages = " + std::to_string(stages) + " must be >= 1");
  if (stages > layers)
    throw ConfigError("pipeline: num_stages = " + std::to_string(stages) + " is more than the " +
                      std::to_string(layers) + " layers of the PipelineModule (each stage needs a layer)");
  Partition p;
  p.bounds.assign(stages + 1, 0);
  const int64_t chunk = layers / stages, extra = layers % stages;
  for (int k = 1; k <= stages; ++k) p.bounds[k] = p.bounds[k - 1] + chunk + (k <= extra ? 1 : 0);
  return p;
}

}  // namespace pipe
}  // namespace deepspeed
