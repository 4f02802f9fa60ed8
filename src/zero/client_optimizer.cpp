// The client optimizer re-pointed at the fp32 partition, or turned into the CPU Adam.
#include "zero/client_optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <optional>
#include <string>
#include <tuple>
#include <unordered_set>

#include "deepspeed/errors.h"
#include "optim/fused_adam.h"

namespace deepspeed {
namespace zero {
namespace {

const char* kWhat = "InitializeArgs.optimizer";

// The partition the stage builds replaces every trainable parameter at once, so the client must
// optimize exactly those, in one group (per-group options cannot be split out of one flat buffer).
void check_parameters(torch::optim::Optimizer& client, const std::vector<at::Tensor>& trainable) {
  const auto& groups = client.param_groups();
  if (groups.size() != 1)
    throw ConfigError(std::string(kWhat) + " has " + std::to_string(groups.size()) +
                      " parameter groups; under ZeRO (and fp16/bf16) the optimizer steps one flat "
                      "partition per rank, so give one group holding all trainable parameters");
  std::unordered_set<const void*> model, given;
  for (const auto& p : trainable) model.insert(p.unsafeGetTensorImpl());
  for (const auto& p : groups[0].params()) {
    if (!model.count(p.unsafeGetTensorImpl()))
      throw ConfigError(std::string(kWhat) +
                        " holds a tensor that is not a trainable parameter of the model; build it "
                        "over model->parameters()");
    given.insert(p.unsafeGetTensorImpl());
  }
  if (given.size() != model.size())
    throw ConfigError(std::string(kWhat) + " holds " + std::to_string(given.size()) + " of the " +
                      std::to_string(model.size()) +
                      " trainable parameters; under ZeRO (and fp16/bf16) it must hold all of them "
                      "(freeze a parameter with requires_grad(false) instead)");
}

// The client's Adam hyper-parameters; nullopt when it is not Adam/AdamW.
std::optional<AdamHyper> adam_hyper(torch::optim::Optimizer& client) {
  auto& options = client.param_groups()[0].options();
  AdamHyper h;
  bool amsgrad = false;
  if (dynamic_cast<torch::optim::AdamW*>(&client) || dynamic_cast<optim::FusedAdam*>(&client)) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(options);
    h.lr = o.lr();
    std::tie(h.beta1, h.beta2) = o.betas();
    h.eps = o.eps();
    h.weight_decay = o.weight_decay();
    h.adamw_mode = true;
    amsgrad = o.amsgrad();
    if (auto* fused = dynamic_cast<optim::FusedAdam*>(&client)) {
      h.adamw_mode = fused->adamw_mode();
      h.bias_correction = fused->bias_correction();
    }
  } else if (dynamic_cast<torch::optim::Adam*>(&client)) {
    auto& o = static_cast<torch::optim::AdamOptions&>(options);
    h.lr = o.lr();
    std::tie(h.beta1, h.beta2) = o.betas();
    h.eps = o.eps();
    h.weight_decay = o.weight_decay();
    h.adamw_mode = false;  // torch.optim.Adam adds weight_decay * param to the gradient (L2)
    amsgrad = o.amsgrad();
  } else {
    return std::nullopt;
  }
  if (amsgrad)
    throw ConfigError(std::string(kWhat) +
                      ": amsgrad = true cannot run on the CPU Adam that optimizer offload uses "
                      "(DeepSpeedCPUAdam has no AMSGrad either)");
  return h;
}

OptimizerFactory repoint(std::shared_ptr<torch::optim::Optimizer> client) {
  return [client](std::vector<at::Tensor> params) {
    client->param_groups()[0].params() = std::move(params);
    client->state().clear();
    return client;
  };
}

}  // namespace

ClientOptimizerOptions client_optimizer_options(const Config& config) {
  return {offload_device(config.zero_optimization.offload_optimizer),
          config.zero_force_ds_cpu_optimizer};
}

OptimizerFactory client_optimizer_factory(std::shared_ptr<torch::optim::Optimizer> client,
                                          const std::vector<at::Tensor>& trainable,
                                          const ClientOptimizerOptions& options) {
  check_parameters(*client, trainable);
  if (options.home == OffloadDevice::kNone) return repoint(std::move(client));
  if (auto hyper = adam_hyper(*client)) {
    return
        [h = *hyper](std::vector<at::Tensor> params) -> std::shared_ptr<torch::optim::Optimizer> {
          return std::make_shared<optim::FusedAdam>(std::move(params), h);
        };
  }
  const bool nvme = options.home == OffloadDevice::kNvme;
  const std::string device = nvme ? "nvme" : "cpu";
  if (options.force_ds_cpu_optimizer || nvme)
    throw ConfigError(
        "zero_optimization.offload_optimizer.device = \"" + device + "\": the client optimizer (" +
        kWhat +
        ") is not torch::optim::Adam or AdamW, and optimizer offload runs DeepSpeed's CPU "
        "Adam (zero_force_ds_cpu_optimizer = true" +
        (nvme ? std::string(", and the nvme swap is an Adam update") : "") +
        "); pass an Adam/AdamW, give the optimizer in the config, or (device cpu) set "
        "\"zero_force_ds_cpu_optimizer\": false to step the client optimizer as it is");
  return repoint(std::move(client));
}

}  // namespace zero
}  // namespace deepspeed
