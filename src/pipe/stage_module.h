// The layers one pipeline stage owns, as one torch::nn::Module (what the stage's Engine trains),
// and the layer building shared by the pipeline and its single-module reference.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "checkpoint/layout.h"
#include "deepspeed/pipe.h"

namespace deepspeed {
namespace pipe {

// Builds spec `index` of `specs` with the RNG seeded from (seed, index): a tied spec from the
// index of the first spec with its key, so every holder of a key starts from the same weights.
// Serialised by a process-wide lock (ranks run as threads in tests and the RNG is global).
torch::nn::AnyModule build_layer(const std::vector<LayerSpec>& specs, size_t index, uint64_t seed);
// The type name "type:<regex>" matches: the module's class name, or the spec's name for a plain
// callable.
std::string layer_type_name(const LayerSpec& spec, const torch::nn::AnyModule& built);

// The checkpoint file of every layer that builds a module (checkpoint/layout.h), with the prefix
// its tensors carry in a StageModule: "layer_XX." ("layer_XX-model_states"), and for a tied key
// "tied_<key>." in the file of the first layer using the key.
std::vector<checkpoint::ModuleFile> layer_files(const std::vector<LayerSpec>& specs);

// Layers [begin, end) of the specs, applied in order. Submodules are named "layer_XX" (the
// global layer index, two digits as DeepSpeed's layer_XX-model_states files) and "tied_<key>"
// (once per key).
class StageModuleImpl : public torch::nn::Module {
 public:
  // `built`: modules already built for some of the layers (by global index); the rest are built.
  StageModuleImpl(const std::vector<LayerSpec>& specs, int64_t begin, int64_t end, uint64_t seed,
                  std::map<size_t, torch::nn::AnyModule> built = {});
  at::Tensor forward(const at::Tensor& x);
  // Layers per checkpointed segment (0: none). Checkpointing applies only while grad mode is on.
  void set_checkpoint_interval(int64_t interval) { interval_ = interval; }
  // The tied modules of this stage by key.
  const std::map<std::string, torch::nn::AnyModule>& tied() const { return tied_; }

 private:
  at::Tensor apply(size_t local, const at::Tensor& x);
  struct Layer {
    torch::nn::AnyModule module;  // empty for a plain callable
    LayerForward forward;
  };
  std::vector<Layer> layers_;
  std::map<std::string, torch::nn::AnyModule> tied_;
  int64_t interval_ = 0;
};
TORCH_MODULE(StageModule);

}  // namespace pipe
}  // namespace deepspeed
