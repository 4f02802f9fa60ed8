// The module file's walk over the parameters, one gather group (a stage-3 unit) at a time.
#include <torch/torch.h>

#include <c10/util/accumulate.h>

#include <exception>
#include <map>

#include "runtime/engine_checkpoint.h"
#include "zero/stage.h"

namespace deepspeed {
namespace checkpoint {

void for_each_whole_parameter(
    EngineState& s, std::optional<int> modifier_rank,
    const std::function<void(const std::string&, const at::Tensor&, bool grouped)>& visit) {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (auto& item : s.module->named_parameters()) params.emplace_back(item.key(), item.value());
  std::vector<int> group(params.size());
  std::map<int, size_t> last;  // group -> index of its last parameter
  for (size_t i = 0; i < params.size(); ++i) {
    group[i] = s.stage->gather_group_of(params[i].second);
    if (group[i] >= 0) last[group[i]] = i;
  }
  std::map<int, std::function<void()>> held;  // gathered groups -> their release
  std::exception_ptr failed;
  try {
    for (size_t i = 0; i < params.size(); ++i) {
      const int g = group[i];
      if (g >= 0 && !held.count(g)) held[g] = s.stage->gather_group(g, modifier_rank);
      if (!failed) {
        try {
          visit(params[i].first, params[i].second.detach(), g >= 0);
        } catch (...) {
          failed = std::current_exception();
        }
      }
      if (g >= 0 && last[g] == i) {
        auto release = std::move(held[g]);
        held.erase(g);
        release();
      }
    }
  } catch (...) {
    // A collective failed: release what is held as far as it goes; the error is what matters.
    for (auto& [g, release] : held) {
      try {
        release();
      } catch (...) {
      }
    }
    throw;
  }
  if (failed) std::rethrow_exception(failed);
}

int64_t whole_numel(const EngineState& s, const at::Tensor& param) {
  return c10::multiply_integers(s.stage->whole_shape(param));
}

}  // namespace checkpoint
}  // namespace deepspeed
