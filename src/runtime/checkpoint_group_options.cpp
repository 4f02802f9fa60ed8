#include "runtime/checkpoint_group_options.h"

#include <optional>
#include <tuple>

#include <torch/optim/adagrad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include "deepspeed/errors.h"
#include "optim/lion.h"

namespace deepspeed {
namespace checkpoint {

nlohmann::json group_options_json(torch::optim::Optimizer& optimizer) {
  nlohmann::json groups = nlohmann::json::array();
  for (auto& group : optimizer.param_groups()) {
    auto& options = group.options();
    nlohmann::json g = {{"lr", options.get_lr()}};
    if (auto* o = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
      g["betas"] = {std::get<0>(o->betas()), std::get<1>(o->betas())};
      g["eps"] = o->eps();
      g["weight_decay"] = o->weight_decay();
      g["amsgrad"] = o->amsgrad();
    } else if (auto* l = dynamic_cast<optim::LionOptions*>(&options)) {
      g["betas"] = {std::get<0>(l->betas()), std::get<1>(l->betas())};
      g["weight_decay"] = l->weight_decay();
    } else if (auto* a = dynamic_cast<torch::optim::AdagradOptions*>(&options)) {
      g["lr_decay"] = a->lr_decay();
      g["weight_decay"] = a->weight_decay();
      g["initial_accumulator_value"] = a->initial_accumulator_value();
      g["eps"] = a->eps();
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
      g["momentum"] = sgd->momentum();
      g["dampening"] = sgd->dampening();
      g["weight_decay"] = sgd->weight_decay();
      g["nesterov"] = sgd->nesterov();
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

namespace {

// saved[key] as a T, when present; a wrong type names the source, the group and the key.
template <class T>
bool read_key(const nlohmann::json& saved, const char* key, T& out, const std::string& source,
              size_t group) {
  auto it = saved.find(key);
  if (it == saved.end()) return false;
  try {
    out = it->get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(source + ": param_groups[" + std::to_string(group) + "]." + key +
                          " is malformed (" + it->dump() + "): " + e.what());
  }
  return true;
}

// saved["betas"], when present: two numbers.
std::optional<std::tuple<double, double>> read_betas(const nlohmann::json& saved,
                                                     const std::string& source, size_t group) {
  std::vector<double> betas;
  if (!read_key(saved, "betas", betas, source, group)) return std::nullopt;
  if (betas.size() != 2)
    throw CheckpointError(source + ": param_groups[" + std::to_string(group) + "].betas has " +
                          std::to_string(betas.size()) + " values, expected 2");
  return std::make_tuple(betas[0], betas[1]);
}

}  // namespace

GroupOptions group_options_from_json(const nlohmann::json& saved,
                                     torch::optim::Optimizer& optimizer,
                                     const std::string& source) {
  auto& groups = optimizer.param_groups();
  GroupOptions out;
  for (size_t g = 0; g < groups.size(); ++g) {
    const nlohmann::json& s = saved.at(g);
    if (!s.is_object())
      throw CheckpointError(source + ": param_groups[" + std::to_string(g) +
                            "] is not an object: " + s.dump());
    auto options = groups[g].options().clone();
    double lr = 0;
    if (read_key(s, "lr", lr, source, g)) options->set_lr(lr);
    double value = 0;
    if (auto* o = dynamic_cast<torch::optim::AdamWOptions*>(options.get())) {
      if (auto betas = read_betas(s, source, g)) o->betas(*betas);
      if (read_key(s, "eps", value, source, g)) o->eps(value);
      if (read_key(s, "weight_decay", value, source, g)) o->weight_decay(value);
      bool amsgrad = false;
      if (read_key(s, "amsgrad", amsgrad, source, g)) o->amsgrad(amsgrad);
    } else if (auto* l = dynamic_cast<optim::LionOptions*>(options.get())) {
      if (auto betas = read_betas(s, source, g)) l->betas(*betas);
      if (read_key(s, "weight_decay", value, source, g)) l->weight_decay(value);
    } else if (auto* a = dynamic_cast<torch::optim::AdagradOptions*>(options.get())) {
      if (read_key(s, "lr_decay", value, source, g)) a->lr_decay(value);
      if (read_key(s, "weight_decay", value, source, g)) a->weight_decay(value);
      if (read_key(s, "initial_accumulator_value", value, source, g))
        a->initial_accumulator_value(value);
      if (read_key(s, "eps", value, source, g)) a->eps(value);
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(options.get())) {
      if (read_key(s, "momentum", value, source, g)) sgd->momentum(value);
      if (read_key(s, "dampening", value, source, g)) sgd->dampening(value);
      if (read_key(s, "weight_decay", value, source, g)) sgd->weight_decay(value);
      bool nesterov = false;
      if (read_key(s, "nesterov", nesterov, source, g)) sgd->nesterov(nesterov);
    }
    out.push_back(std::move(options));
  }
  return out;
}

ArchiveGroups read_archive_groups(const std::string& archive_bytes,
                                  torch::optim::Optimizer& optimizer) {
  auto& groups = optimizer.param_groups();
  torch::serialize::InputArchive archive, saved_groups;
  std::vector<torch::serialize::InputArchive> saved;
  ArchiveGroups out;
  try {
    archive.load_from(archive_bytes.data(), archive_bytes.size(), c10::Device(c10::kCPU));
    archive.read("param_groups", saved_groups);
    at::Tensor count;
    saved_groups.read("param_groups/size", count);
    for (int64_t g = 0; g < count.item<int64_t>(); ++g) {
      saved.emplace_back();
      saved_groups.read("param_groups/" + std::to_string(g), saved.back());
      at::Tensor size;
      saved.back().read("params/size", size);
      out.sizes.push_back(size.item<int64_t>());
    }
  } catch (const c10::Error&) {
    return {};  // not libtorch's layout
  }
  if (saved.size() != groups.size()) return out;
  try {
    for (size_t g = 0; g < groups.size(); ++g) {
      torch::serialize::InputArchive options_archive;
      saved[g].read("options", options_archive);
      // The group's own options type reads its keys (libtorch's AdamW, SGD, Adagrad, ...).
      auto options = groups[g].options().clone();
      options->serialize(options_archive);
      out.options.push_back(std::move(options));
    }
  } catch (const c10::Error&) {
    out.options.clear();  // options of another type: keep the engine's
  }
  return out;
}

void set_group_options(torch::optim::Optimizer& optimizer, GroupOptions options) {
  auto& groups = optimizer.param_groups();
  if (options.empty()) return;
  TORCH_CHECK(options.size() == groups.size(), "set_group_options: ", options.size(),
              " options for ", groups.size(), " parameter groups (internal error)");
  for (size_t g = 0; g < groups.size(); ++g) groups[g].set_options(std::move(options[g]));
}

}  // namespace checkpoint
}  // namespace deepspeed
