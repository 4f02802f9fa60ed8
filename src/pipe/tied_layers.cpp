// Tied layers across stages (tied_layers.h): their groups, the initial broadcast and the
// gradient sum.
#include "pipe/tied_layers.h"

#include <map>
#include <set>

#include <torch/torch.h>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace pipe {

TiedLayers tie_layers(const PipelineModule& model, const Partition& partition,
                      const StageModuleImpl& module, const comm::Topology& topology,
                      int zero_stage) {
  const int stages = static_cast<int>(partition.bounds.size()) - 1;
  const int tensor = topology.grid().tensor_size();
  const auto coords = topology.coordinates();
  std::map<std::string, std::set<int>> holders;
  for (int s = 0; s < stages; ++s)
    for (int64_t i = partition.bounds[s]; i < partition.bounds[s + 1]; ++i)
      if (!model.layers[i].tied_key.empty()) holders[model.layers[i].tied_key].insert(s);
  TiedLayers tied;
  for (auto& [key, owners] : holders) {
    if (stages > 1 && owners.size() < 2)
      throw ConfigError("TiedLayerSpec \"" + key + "\": every layer with this key is on stage " +
                        std::to_string(*owners.begin()) +
                        "; a tied layer must span stages (use a LayerSpec, or another partition)");
    if (owners.size() < 2) continue;
    tied.spans_stages = true;
    if (zero_stage == 2)
      throw ConfigError("TiedLayerSpec \"" + key + "\" with zero_optimization.stage = 2: tied "
                        "gradients are reduced between stages on whole gradients, which ZeRO-2 "
                        "does not keep; use zero_optimization.stage 0 or 1");
    const bool holder = owners.count(coords.pipe) > 0;
    auto c =
        topology.world()->split(holder ? coords.data * tensor + coords.tensor : -1, coords.pipe);
    if (!holder) continue;
    TiedGroup g{key, c, {}};
    for (auto& p : module.tied().at(key).ptr()->parameters()) g.params.push_back(p);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : g.params) c->broadcast(p, 0)->wait();  // from the lowest holding stage
    }
    if (coords.pipe != *owners.begin())
      for (auto& p : g.params)
        if (p.requires_grad()) tied.counted_twice.push_back(p);
    tied.groups.push_back(std::move(g));
  }
  return tied;
}

// After the data-parallel reduction (inside the boundary backward): a sum of means is the mean of
// sums, so the order does not change the result.
void reduce_tied_grads(std::vector<TiedGroup>& groups) {
  for (auto& g : groups)
    for (auto& p : g.params)
      if (p.requires_grad()) {
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
        g.comm->all_reduce(p.mutable_grad())->wait();
      }
}

}  // namespace pipe
}  // namespace deepspeed
