// The "optimizer" block → a libtorch optimizer (DeepSpeed's engine._configure_basic_optimizer).
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <limits>
#include <sstream>

#include "deepspeed/errors.h"
#include "deepspeed/optimizer.h"
#include "optim/adagrad_state.h"
#include "optim/adam_keys.h"
#include "optim/lamb.h"
#include "optim/lion.h"
#include "optim/momentum_mask.h"
#include "optim/onebit_types.h"
#include "optim/param_reader.h"
#include "optim/self_communicating.h"
#include "util/ascii.h"

namespace deepspeed {
namespace {

using optim::check_range;
using optim::ParamReader;
using optim::reject_unread;

const std::vector<std::string> kSupported = [] {
  std::vector<std::string> names = {"Adam", "AdamW", "SGD", "Adagrad", "Lamb", "Lion"};
  for (const char* name : optim::kOneBitOptimizerTypes) names.push_back(name);
  return names;
}();
// DeepSpeed types this project does not build (yet); named so the error says so plainly.
const std::vector<std::string> kNotImplemented = {"MuAdam", "MuAdamW", "MuSGD"};

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

void reject_max_grad_norm(const ParamReader& r) {
  if (r.has("max_grad_norm")) {
    throw ConfigError(r.path("max_grad_norm") +
                      " is not supported as an optimizer parameter; use the top-level "
                      "\"gradient_clipping\" key instead");
  }
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// DeepSpeed's torch_adam: true builds torch.optim.AdamW (decoupled) or torch.optim.Adam from the
// keys left after it pops torch_adam and adam_w_mode. Their arithmetic is FusedAdam's, so the
// update stays ours; what changes is torch's keyword set: its AdamW's weight_decay defaults to
// 0.01, and FusedAdam's own keys are a TypeError there.
void read_torch_adam(ParamReader& r, AdamHyper& h) {
  for (const char* key : {"bias_correction", "set_grad_none"}) {
    if (r.has(key))
      throw ConfigError(r.path(key) + " is a FusedAdam parameter: with " + r.path("torch_adam") +
                        " = true DeepSpeed passes it to torch.optim." +
                        (h.adamw_mode ? "AdamW" : "Adam") + ", which does not take it");
  }
  if (r.get_bool("amsgrad", false))
    throw ConfigError(r.path("amsgrad") + " = true is not supported: with " + r.path("torch_adam") +
                      " = true deepspeed.cpp still runs its FusedAdam update, which has no "
                      "AMSGrad variant");
  if (h.adamw_mode) h.weight_decay = 0.01;  // torch.optim.AdamW's default; Adam's is 0
}

AdamHyper read_adam(ParamReader& r, const std::string& type) {
  AdamHyper h;
  bool adam_w_mode = r.get_bool("adam_w_mode", true);
  h.adamw_mode = type == "AdamW" || adam_w_mode;  // DeepSpeed: AdamW is decoupled regardless
  const bool torch_adam = r.get_bool("torch_adam", false);
  if (torch_adam) read_torch_adam(r, h);
  read_adam_keys(r, h, "FusedAdam");
  if (!torch_adam) {
    h.bias_correction = r.get_bool("bias_correction", true);
    r.get_bool("set_grad_none", true);  // FusedAdam's zero_grad flavour; no effect here
  }
  return h;
}

ParamReader reader_for(const OptimizerConfig& config) {
  ParamReader r(config.params, "optimizer.params");
  reject_max_grad_norm(r);
  return r;
}

std::shared_ptr<torch::optim::Optimizer> build_adam(
    const OptimizerConfig& config, const std::string& type,
    std::vector<torch::optim::OptimizerParamGroup> groups) {
  AdamHyper h = parse_adam_params(config);
  if (!h.bias_correction) {
    throw ConfigError(
        "optimizer.params.bias_correction = false is not supported by the libtorch "
        "Adam/AdamW that make_optimizer builds");
  }
  auto betas = std::make_tuple(h.beta1, h.beta2);
  if (h.adamw_mode) {
    auto o = torch::optim::AdamWOptions(h.lr).betas(betas).eps(h.eps).weight_decay(h.weight_decay);
    return std::make_shared<torch::optim::AdamW>(std::move(groups), o);
  }
  auto o = torch::optim::AdamOptions(h.lr).betas(betas).eps(h.eps).weight_decay(h.weight_decay);
  return std::make_shared<torch::optim::Adam>(std::move(groups), o);
}

std::shared_ptr<torch::optim::Optimizer> build_sgd(
    const OptimizerConfig& config, std::vector<torch::optim::OptimizerParamGroup> groups) {
  ParamReader r = reader_for(config);
  auto o = torch::optim::SGDOptions(r.get_double("lr", 1e-3));
  o.momentum(r.get_double("momentum", 0.0));
  o.dampening(r.get_double("dampening", 0.0));
  o.weight_decay(r.get_double("weight_decay", 0.0));
  o.nesterov(r.get_bool("nesterov", false));
  reject_unread(r, "SGD");
  check_range(r, "lr", o.lr(), 0, kInf);
  check_range(r, "momentum", o.momentum(), 0, kInf);
  check_range(r, "weight_decay", o.weight_decay(), 0, kInf);
  if (o.nesterov() && (o.momentum() <= 0 || o.dampening() != 0)) {
    throw ConfigError(r.path("nesterov") + " = true requires momentum > 0 and dampening = 0");
  }
  return std::make_shared<torch::optim::SGD>(std::move(groups), o);
}

std::shared_ptr<torch::optim::Optimizer> build_adagrad(
    const OptimizerConfig& config, std::vector<torch::optim::OptimizerParamGroup> groups) {
  ParamReader r = reader_for(config);
  auto o = torch::optim::AdagradOptions(r.get_double("lr", 1e-2));
  o.lr_decay(r.get_double("lr_decay", 0.0));
  o.weight_decay(r.get_double("weight_decay", 0.0));
  o.initial_accumulator_value(r.get_double("initial_accumulator_value", 0.0));
  o.eps(r.get_double("eps", 1e-10));
  reject_unread(r, "Adagrad");
  check_range(r, "lr", o.lr(), 0, kInf);
  check_range(r, "lr_decay", o.lr_decay(), 0, kInf);
  check_range(r, "weight_decay", o.weight_decay(), 0, kInf);
  check_range(r, "initial_accumulator_value", o.initial_accumulator_value(), 0, kInf);
  check_range(r, "eps", o.eps(), 0, kInf);
  // Its state for a group added later (model_parameters) is made at its first step.
  return std::make_shared<optim::LazyStateAdagrad>(std::move(groups), o);
}

}  // namespace

std::vector<std::string> supported_optimizers() { return kSupported; }

std::string canonical_optimizer_type(const std::string& type) {
  for (const auto& name : kSupported) {
    if (ascii_lower(name) == ascii_lower(type)) return name;
  }
  for (const auto& name : kNotImplemented) {
    if (ascii_lower(name) == ascii_lower(type)) {
      throw ConfigError("optimizer.type: \"" + type +
                        "\" is not implemented in deepspeed.cpp; "
                        "supported: " +
                        join(kSupported));
    }
  }
  throw ConfigError("optimizer.type: unknown optimizer \"" + type +
                    "\"; supported (case-insensitive): " + join(kSupported));
}

AdamHyper parse_adam_params(const OptimizerConfig& config) {
  std::string type = canonical_optimizer_type(config.type);
  if (type != "Adam" && type != "AdamW") {
    throw ConfigError("optimizer.type: expected Adam or AdamW for Adam hyper-parameters, got \"" +
                      config.type + "\"");
  }
  ParamReader r = reader_for(config);
  AdamHyper h = read_adam(r, type);
  reject_unread(r, type);
  return h;
}

std::shared_ptr<torch::optim::Optimizer> make_optimizer(
    const OptimizerConfig& config, std::vector<torch::optim::OptimizerParamGroup> groups) {
  std::string type = canonical_optimizer_type(config.type);
  if (type == "Adam" || type == "AdamW") return build_adam(config, type, std::move(groups));
  if (type == "SGD") return build_sgd(config, std::move(groups));
  if (type == "Lamb") {
    reader_for(config);  // max_grad_norm's own message first
    std::vector<at::Tensor> params;
    for (auto& g : groups) {
      if (g.has_options())
        throw ConfigError("optimizer.type \"Lamb\": per-group options are not supported");
      params.insert(params.end(), g.params().begin(), g.params().end());
    }
    return std::make_shared<optim::Lamb>(std::move(params), optim::parse_lamb_params(config));
  }
  if (type == "Lion")
    return std::make_shared<optim::Lion>(std::move(groups),
                                         optim::lion_options(optim::parse_lion_params(config)));
  if (optim::is_onebit_optimizer(type))
    throw ConfigError("optimizer.type \"" + type + "\": its momentum all-reduce is a collective of "
                      "the engine's data-parallel group, so only deepspeed::initialize() builds "
                      "it (make_optimizer cannot)");
  return build_adagrad(config, std::move(groups));
}

std::shared_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        std::vector<at::Tensor> params) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::move(params));
  return make_optimizer(config, std::move(groups));
}

void set_exp_avg_mask(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                      const at::Tensor& mask) {
  auto* masks = dynamic_cast<optim::MomentumMasks*>(&optimizer);
  if (!masks)
    throw ConfigError("set_exp_avg_mask: the optimizer is not a 1-bit optimizer (OneBitAdam, "
                      "ZeroOneAdam, OneBitLamb); only they compress momentum");
  // 16 bits: the optimizer steps one flat fp32 master; the mask goes to the parameter's segment.
  auto* onebit = dynamic_cast<optim::SelfCommunicatingOptimizer*>(&optimizer);
  if (onebit && !onebit->segment_params().empty()) {
    const auto& params = onebit->segment_params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].unsafeGetTensorImpl() != param.unsafeGetTensorImpl()) continue;
      if (mask.sizes() != params[i].sizes())
        throw ConfigError("set_exp_avg_mask: mask of shape " + c10::str(mask.sizes()) +
                          " for a parameter of shape " + c10::str(params[i].sizes()));
      masks->set_mask(i, mask.to(params[i].device(), torch::kFloat).reshape({-1}).contiguous());
      return;
    }
    throw ConfigError("set_exp_avg_mask: the tensor of shape " + c10::str(param.sizes()) +
                      " is not one of the model's trainable parameters");
  }
  size_t index = 0;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) {
      if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) {
        if (mask.sizes() != p.sizes())
          throw ConfigError("set_exp_avg_mask: mask of shape " + c10::str(mask.sizes()) +
                            " for a parameter of shape " + c10::str(p.sizes()));
        masks->set_mask(index, mask.to(p.options()).contiguous());
        return;
      }
      ++index;
    }
  throw ConfigError("set_exp_avg_mask: the tensor of shape " + c10::str(param.sizes()) +
                    " is not one of the optimizer's parameters");
}

}  // namespace deepspeed
