// The client optimizer re-pointed at the fp32 partition, or turned into the CPU Adam.
#include "zero/client_optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <optional>
#include <string>
#include <tuple>

#include "deepspeed/errors.h"
#include "optim/adamw_state.h"
#include "optim/fused_adam.h"
#include "optim/lamb.h"
#include "optim/self_communicating.h"
#include "zero/flat_groups.h"

namespace deepspeed {
namespace zero {
namespace {

const char* kWhat = "InitializeArgs.optimizer";

// The partition the stage builds replaces every trainable parameter at once, so the client's
// groups must hold exactly those, each once (client_group_of says what is wrong). Several groups
// step the views of the master over their segments (zero/flat_groups.h), or FusedAdam the master
// segment by segment; Lamb (per-parameter trust-ratio fragments) and the 1-bit optimizers
// (per-parameter compression segments) keep their state otherwise and are refused with several.
void check_parameters(torch::optim::Optimizer& client, const std::vector<at::Tensor>& trainable) {
  client_group_of(client, trainable);
  const size_t groups = client.param_groups().size();
  if (groups == 1) return;
  const char* own = dynamic_cast<optim::Lamb*>(&client) ? "Lamb"
                    : dynamic_cast<optim::SelfCommunicatingOptimizer*>(&client) ? "a 1-bit optimizer"
                                                                                 : nullptr;
  if (own)
    throw ConfigError(std::string(kWhat) + " is " + own + " with " + std::to_string(groups) +
                      " parameter groups; under ZeRO (and fp16/bf16) several groups need a "
                      "libtorch optimizer (torch::optim::AdamW, Adam, SGD, ...) or FusedAdam, or "
                      "give one group");
}

// The client's Adam hyper-parameters in parameter group `group`; nullopt when it is not
// Adam/AdamW.
std::optional<AdamHyper> adam_hyper(torch::optim::Optimizer& client, size_t group = 0) {
  auto& options = client.param_groups().at(group).options();
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

// (A libtorch Adagrad, whose constructor alone makes its state, gets that state for the
// partition at its first step there: the shard's step adds it, optim/adagrad_state.h.)
OptimizerFactory repoint(std::shared_ptr<torch::optim::Optimizer> client) {
  return [client](std::vector<at::Tensor> params) {
    client->param_groups()[0].params() = std::move(params);
    client->state().clear();
    return client;
  };
}

}  // namespace

void describe_client_groups(torch::optim::Optimizer* client,
                            const std::vector<at::Tensor>& trainable, ShardOptions& shard) {
  if (!client || client->param_groups().size() < 2) return;
  shard.group_of = client_group_of(*client, trainable);
  shard.group_count = static_cast<int>(client->param_groups().size());
}

ClientOptimizerOptions client_optimizer_options(const Config& config) {
  return {offload_device(config.zero_optimization.offload_optimizer),
          config.zero_force_ds_cpu_optimizer};
}

OptimizerFactory client_optimizer_factory(std::shared_ptr<torch::optim::Optimizer> client,
                                          const std::vector<at::Tensor>& trainable,
                                          const ClientOptimizerOptions& options) {
  check_parameters(*client, trainable);
  if (options.home == OffloadDevice::kNone) return repoint(std::move(client));
  const size_t groups = client->param_groups().size();
  if (auto hyper = adam_hyper(*client)) {
    // One FusedAdam group per client group (their options; adam_w_mode and bias correction are
    // the optimizer's); the shard steps each group's segments with them (FusedAdam::set_flat,
    // whole or range by range; the nvme swap sub-group by sub-group, offload/swapped_shard.h).
    std::vector<AdamHyper> per_group{*hyper};
    for (size_t g = 1; g < groups; ++g) per_group.push_back(*adam_hyper(*client, g));
    return [per_group](std::vector<at::Tensor> params) -> std::shared_ptr<torch::optim::Optimizer> {
      auto adam = std::make_shared<optim::FusedAdam>(std::move(params), per_group[0]);
      for (size_t g = 1; g < per_group.size(); ++g)
        adam->add_param_group(torch::optim::OptimizerParamGroup(
            std::vector<at::Tensor>(),
            std::make_unique<torch::optim::AdamWOptions>(optim::adamw_options(per_group[g]))));
      return adam;
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
