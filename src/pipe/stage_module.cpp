#include "pipe/stage_module.h"

#include <torch/torch.h>

#include "deepspeed/checkpointing.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>

namespace deepspeed {
namespace pipe {

LayerSpec Lambda(std::string name, std::function<at::Tensor(const at::Tensor&)> fn) {
  LayerSpec s;
  s.name = std::move(name);
  s.forward = [fn = std::move(fn)](torch::nn::AnyModule&, const at::Tensor& x) { return fn(x); };
  return s;
}

LayerSpec TiedLayerSpec(std::string key, std::function<torch::nn::AnyModule()> build,
                        LayerForward forward, std::string name) {
  LayerSpec s(name.empty() ? "tied:" + key : std::move(name), std::move(build), std::move(forward));
  s.tied_key = std::move(key);
  return s;
}

torch::nn::AnyModule build_layer(const std::vector<LayerSpec>& specs, size_t index, uint64_t seed) {
  const LayerSpec& spec = specs[index];
  if (!spec.build) {
    if (!spec.forward)
      throw ConfigError("PipelineModule: layer " + std::to_string(index) + " (\"" + spec.name +
                        "\") has neither a build function nor a forward function");
    return torch::nn::AnyModule();
  }
  size_t seed_index = index;
  if (!spec.tied_key.empty())
    for (size_t i = 0; i < specs.size(); ++i)
      if (specs[i].tied_key == spec.tied_key) {
        seed_index = i;
        break;
      }
  static std::mutex rng_lock;
  std::lock_guard<std::mutex> lock(rng_lock);
  torch::manual_seed(seed + seed_index);
  return spec.build();
}

std::string layer_type_name(const LayerSpec& spec, const torch::nn::AnyModule& built) {
  return built.is_empty() ? spec.name : built.ptr()->name();
}

namespace {
std::string two_digits(size_t i) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%02zu", i);
  return buf;
}
}  // namespace

std::vector<checkpoint::ModuleFile> layer_files(const std::vector<LayerSpec>& specs) {
  std::vector<checkpoint::ModuleFile> out;
  std::set<std::string> tied_seen;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].build) continue;
    const std::string& key = specs[i].tied_key;
    if (!key.empty() && !tied_seen.insert(key).second) continue;
    const std::string prefix = key.empty() ? "layer_" + two_digits(i) + "." : "tied_" + key + ".";
    out.push_back({checkpoint::layer_file_name(static_cast<int64_t>(i)), prefix,
                   static_cast<int64_t>(i)});
  }
  return out;
}

StageModuleImpl::StageModuleImpl(const std::vector<LayerSpec>& specs, int64_t begin, int64_t end,
                                 uint64_t seed, std::map<size_t, torch::nn::AnyModule> built) {
  for (int64_t i = begin; i < end; ++i) {
    const LayerSpec& spec = specs[i];
    Layer layer;
    layer.forward = spec.forward;
    if (!spec.tied_key.empty()) {
      auto it = tied_.find(spec.tied_key);
      if (it == tied_.end()) {
        auto b = built.count(i) ? built[i] : build_layer(specs, i, seed);
        register_module("tied_" + spec.tied_key, b.ptr());
        it = tied_.emplace(spec.tied_key, b).first;
      }
      layer.module = it->second;
    } else {
      layer.module = built.count(i) ? built[i] : build_layer(specs, i, seed);
      if (!layer.module.is_empty()) register_module("layer_" + two_digits(i), layer.module.ptr());
    }
    layers_.push_back(std::move(layer));
  }
}

at::Tensor StageModuleImpl::apply(size_t local, const at::Tensor& x) {
  Layer& l = layers_[local];
  if (l.forward) return l.forward(l.module, x);
  return l.module.forward(x);
}

at::Tensor StageModuleImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  if (interval_ <= 0 || !torch::GradMode::is_enabled()) {
    for (size_t i = 0; i < layers_.size(); ++i) h = apply(i, h);
    return h;
  }
  // Every `interval_` layers form one checkpointed segment: only its input is kept, the rest is
  // recomputed in backward. (A segment whose input carries no gradient, the first stage's token
  // ids, is checkpointed too: checkpoint() keeps such a segment's parameters in the graph.)
  const size_t step = static_cast<size_t>(interval_);
  for (size_t i = 0; i < layers_.size(); i += step) {
    const size_t end = std::min(layers_.size(), i + step);
    auto segment = [this, i, end](const at::Tensor& in) {
      at::Tensor y = in;
      for (size_t k = i; k < end; ++k) y = apply(k, y);
      return y;
    };
    h = checkpointing::checkpoint(segment, h);
  }
  return h;
}

PipelineSequentialImpl::PipelineSequentialImpl(const PipelineModule& model, uint64_t seed)
    : loss_fn_(model.loss_fn) {
  auto all = register_module(
      "layers", StageModule(model.layers, 0, static_cast<int64_t>(model.layers.size()), seed));
  layers_ = [all](const at::Tensor& x) { return all->forward(x); };
}

at::Tensor PipelineSequentialImpl::forward(const at::Tensor& inputs, const at::Tensor& labels) {
  return loss_fn_(layers_(inputs), labels);
}

}  // namespace pipe
}  // namespace deepspeed
