#include "optim/config_groups.h"

#include <algorithm>

#include "deepspeed/engine.h"
#include "deepspeed/errors.h"
#include "deepspeed/optimizer.h"
#include "optim/lion.h"
#include "optim/onebit_types.h"
#include "optim/optimizer_params.h"
#include "zero/flat_groups.h"

namespace deepspeed {
namespace optim {
namespace {

const char* kField = "InitializeArgs.model_parameters";

std::string group_name(size_t g) { return std::string(kField) + "[" + std::to_string(g) + "]"; }

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// The keys a group may set: those the type keeps in each parameter group's options (libtorch's
// SGDOptions, AdagradOptions; optim::LionOptions; the AdamWOptions of FusedAdam, Lamb and the
// 1-bit family). The rest (adam_w_mode, bias_correction, Lamb's coefficients, the 1-bit freeze
// steps, ...) belong to the whole optimizer, in optimizer.params.
std::vector<std::string> per_group_keys(const std::string& type) {
  if (type == "SGD") return {"lr", "momentum", "dampening", "weight_decay", "nesterov"};
  if (type == "Adagrad")
    return {"lr", "lr_decay", "weight_decay", "eps", "initial_accumulator_value"};
  if (type == "Lion") return {"lr", "betas", "weight_decay"};
  return {"lr", "betas", "eps", "weight_decay"};
}

bool takes_one_group(const std::string& type) {
  return type == "Lamb" || is_onebit_optimizer(type);
}

// Reads `block` as the optimizer would be built from it: ConfigError for a bad value.
void check_block(const OptimizerConfig& block, const std::string& type) {
  std::vector<std::string> warnings;  // said when the optimizer is built
  if (type == "Adam" || type == "AdamW") {
    parse_adam_params(block);
  } else if (type == "Lion") {
    parse_lion_params(block);
  } else if (type == "Lamb") {
    parse_lamb_params(block);
  } else if (type == "OneBitAdam") {
    parse_onebit_adam_params(block, &warnings);
  } else if (type == "ZeroOneAdam") {
    parse_zero_one_adam_params(block, &warnings);
  } else if (type == "OneBitLamb") {
    parse_onebit_lamb_params(block, &warnings);
  } else {
    make_optimizer(block, std::vector<at::Tensor>{});
  }
}

// Group g's block: its options over the block's "params", each key one the type keeps per group.
OptimizerConfig group_block(const OptimizerConfig& block, const std::string& type,
                            const ParamGroup& group, size_t g) {
  const nlohmann::json& options = group.options;
  if (!options.is_null() && !options.is_object())
    throw ConfigError(group_name(g) +
                      ".options must be a JSON object of optimizer parameters, "
                      "got " +
                      options.dump());
  OptimizerConfig out = block;
  if (options.is_null()) return out;
  const auto keys = per_group_keys(type);
  for (const auto& item : options.items()) {
    if (std::find(keys.begin(), keys.end(), item.key()) != keys.end()) continue;
    throw ConfigError(group_name(g) + ".options: \"" + item.key() +
                      "\" is not a per-group parameter of optimizer type " + type +
                      " (a group may set: " + joined(keys) +
                      "; the type's other parameters "
                      "are the whole optimizer's, in the config's optimizer.params)" +
                      (item.key() == "params" ? "; the tensors go in ParamGroup::params" : ""));
  }
  if (!out.params.is_object()) out.params = nlohmann::json::object();
  out.params.update(options);
  try {
    check_block(out, type);
  } catch (const ConfigError& e) {
    // The parsers name optimizer.params.<key>; the value at fault may be the group's.
    throw ConfigError(group_name(g) + " (optimizer type " + type +
                      ", its options over optimizer.params): " + e.what());
  }
  return out;
}

// Several groups are refused only for the types whose state is laid out per parameter (Lamb,
// the 1-bit ones). Every stage and offload takes them otherwise: the segment table cuts the
// partition by group (zero/flat_groups.h), and grouped_optimizer gives the CPU Adam and the nvme swap's
// placeholder FusedAdam one group per model group, whose options each piece of their update
// (a range, a sub-group) takes where it crosses into that group's segments.
void check_several_groups(const std::string& type, size_t count) {
  if (count < 2 || !takes_one_group(type)) return;
  throw ConfigError(std::string(kField) + " has " + std::to_string(count) +
                    " parameter groups; optimizer type " + type +
                    " keeps its state per parameter over one group here (as under a client "
                    "optimizer); give one group, or use Adam/AdamW, SGD, Adagrad or Lion");
}

}  // namespace

ConfigGroups resolve_model_parameters(const Config& config, bool client_optimizer,
                                      const std::vector<ParamGroup>& groups,
                                      const std::vector<at::Tensor>& trainable,
                                      const std::vector<std::string>& names) {
  // DeepSpeed steps a client optimizer object and leaves model_parameters unused: refused here,
  // so groups meant for the optimizer are not silently dropped.
  if (client_optimizer)
    throw ConfigError(std::string(kField) +
                      " and InitializeArgs.optimizer are both set: the "
                      "groups are for the optimizer the config's \"optimizer\" block builds; "
                      "give the client optimizer its parameter groups instead, or drop it");
  if (!config.optimizer)
    throw ConfigError(std::string(kField) +
                      " is set but the config has no \"optimizer\" block "
                      "to build over its groups; add one");
  const std::string type = canonical_optimizer_type(config.optimizer->type);
  check_block(*config.optimizer, type);  // the config's own values first, named as its keys
  check_several_groups(type, groups.size());
  ConfigGroups out;
  std::vector<std::vector<at::Tensor>> tensors;
  for (size_t g = 0; g < groups.size(); ++g) {
    out.blocks.push_back(group_block(*config.optimizer, type, groups[g], g));
    tensors.push_back(groups[g].params);
  }
  out.group_of = zero::group_of_tensors(
      tensors, trainable, kField,
      "every trainable parameter must be in one, since the optimizer steps only its groups", names);
  return out;
}

std::shared_ptr<torch::optim::Optimizer> grouped_optimizer(
    const ConfigGroups& groups, std::vector<std::vector<at::Tensor>> per_group,
    const BlockOptimizer& build) {
  TORCH_CHECK(static_cast<int>(per_group.size()) == groups.count(),
              "grouped_optimizer: tensors for ", per_group.size(), " groups, ", groups.count(),
              " expected");
  auto optimizer = build(groups.blocks[0], std::move(per_group[0]));
  for (int g = 1; g < groups.count(); ++g) {
    auto options = build(groups.blocks[g], {})->param_groups().at(0).options().clone();
    optimizer->add_param_group(
        torch::optim::OptimizerParamGroup(std::move(per_group[g]), std::move(options)));
  }
  return optimizer;
}

std::vector<std::vector<at::Tensor>> split_by_group(const std::vector<at::Tensor>& trainable,
                                                    const ConfigGroups& groups) {
  std::vector<std::vector<at::Tensor>> out(groups.count());
  for (size_t k = 0; k < trainable.size(); ++k)
    out.at(groups.group_of.at(k)).push_back(trainable[k]);
  return out;
}

}  // namespace optim
}  // namespace deepspeed
