#include "tp/tp_stage.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "deepspeed/errors.h"
#include "deepspeed/tp.h"
#include "zero/forwarding_stage.h"

namespace deepspeed {
namespace tp {
namespace {

class TensorParallelStage : public zero::ForwardingStage {
 public:
  TensorParallelStage(std::unique_ptr<zero::ZeroStage> inner, comm::CommunicatorPtr group,
                      std::vector<at::Tensor> split)
      : ForwardingStage(std::move(inner)), group_(std::move(group)), split_(std::move(split)) {}

  // COLLECTIVE over the data-parallel group, then the tensor-parallel group (and the
  // data-parallel group again where its ranks' gradients stay local: the inner stage's overflow
  // vote). On the device, not read: the engine reads it only when the step needs it (clipping,
  // fp16's overflow vote). A non-finite square anywhere (NaN too) is inf on every rank, as
  // global_grad_norm() and the pipeline's norm say: the overflow vote, and a clip coefficient
  // of 0 rather than NaN.
  at::Tensor global_grad_norm_tensor() override {
    const at::Tensor sums = inner().grad_square_sums(split_);
    at::Tensor split_sq = sums.narrow(0, 0, 1).clone();
    if (group_->world_size() > 1) group_->all_reduce(split_sq)->wait();
    split_sq.add_(sums.narrow(0, 1, 1));
    const at::Tensor norm = inner().agreed_across_data_ranks(split_sq.sqrt_());
    return at::where(norm.isfinite(), norm,
                     torch::full_like(norm, std::numeric_limits<double>::infinity()));
  }
  double global_grad_norm() override {
    const double norm = global_grad_norm_tensor().item<double>();
    return std::isfinite(norm) ? norm : std::numeric_limits<double>::infinity();
  }

 private:
  comm::CommunicatorPtr group_;
  std::vector<at::Tensor> split_;
};

// "blocks.0.attn.qkv (ColumnParallelLinear)"; the class name without namespaces or "Impl".
std::string layer_label(const std::string& name, const torch::nn::Module& m) {
  std::string type = m.name();
  type = type.substr(type.rfind(':') == std::string::npos ? 0 : type.rfind(':') + 1);
  if (type.size() > 4 && type.compare(type.size() - 4, 4, "Impl") == 0)
    type.resize(type.size() - 4);
  return (name.empty() ? std::string("the model itself") : "'" + name + "'") + " (" + type + ")";
}

}  // namespace

void check_split_layers(const torch::nn::Module& module, const comm::Topology* topology,
                        const std::string& args) {
  const int tensor = topology ? topology->grid().tensor_size() : 1;
  std::string error;  // this rank's first layer that does not sit on the topology's tensor group
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    const auto* layer = dynamic_cast<const SplitLayer*>(item.value().get());
    if (!error.empty() || !layer || !layer->group() || layer->group()->world_size() == 1) continue;
    const int size = layer->group()->world_size();
    const std::string what = "layer " + layer_label(item.key(), *item.value()) +
                             " is split over a group of " + std::to_string(size) + " ranks";
    if (!topology)
      error = args + " is not given (tensor size 1), but " + what +
              ": pass the comm::Topology whose tensor_parallel() group the model was built on";
    else if (size != tensor)
      error = args + " has tensor size " + std::to_string(tensor) + ", but " + what +
              ": build the model on that topology's tensor_parallel() group";
    else if (layer->group()->rank() != topology->coordinates().tensor)
      error = args + ": " + what + " in which world rank " +
              std::to_string(topology->world()->rank()) + " is rank " +
              std::to_string(layer->group()->rank()) + ", but its tensor coordinate is " +
              std::to_string(topology->coordinates().tensor) +
              ": build the model on that topology's tensor_parallel() group";
  }
  if (!topology) {
    if (!error.empty()) throw ConfigError(error);
    return;
  }
  // Every rank stops, not only those that found a mismatch (a group of the right size but other
  // members fails on some ranks only): the others would go on into initialize's collectives and
  // wait there until the timeout. COLLECTIVE over the world.
  at::Tensor failed = torch::full({1}, error.empty() ? 0.0f : 1.0f);
  if (topology->world()->world_size() > 1)
    topology->world()->all_reduce(failed, comm::ReduceOp::Max)->wait();
  if (!error.empty()) throw ConfigError(error);
  if (failed.item<float>() > 0)
    throw ConfigError(args + ": another rank's split layers are not on the topology's "
                      "tensor_parallel() group (its error names the layer); world rank " +
                      std::to_string(topology->world()->rank()) + " stops too");
}

void check_initialize_args(const torch::nn::Module& module, const comm::Topology* topology,
                           const Config& config) {
  check_split_layers(module, topology, "initialize(): InitializeArgs.topology");
  const int tensor = topology ? topology->grid().tensor_size() : 1;
  const auto& zero = config.zero_optimization;
  if (tensor > 1 && zero.stage == 3 && zero.offload_optimizer.device == "nvme")
    throw ConfigError(
        "zero_optimization.offload_optimizer.device = \"nvme\" at zero_optimization.stage = 3 "
        "with tensor parallelism (InitializeArgs.topology has tensor size " +
        std::to_string(tensor) +
        ") is not supported: the gradient partition is on disk, so its norm cannot be split by "
        "parameter; use offload_optimizer.device \"cpu\", or ZeRO stage 1 or 2 with nvme");
}

std::unique_ptr<zero::ZeroStage> tensor_parallel_stage(std::unique_ptr<zero::ZeroStage> inner,
                                                       comm::CommunicatorPtr tensor_group,
                                                       std::vector<at::Tensor> split) {
  return std::make_unique<TensorParallelStage>(std::move(inner), std::move(tensor_group),
                                               std::move(split));
}

}  // namespace tp
}  // namespace deepspeed
