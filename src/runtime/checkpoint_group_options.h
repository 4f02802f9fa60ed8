// The optimizer's parameter-group options in checkpoints: what DeepSpeed's optimizer state dict
// keeps as `param_groups` (everything but the params), restored with the optimizer state so a
// resumed job steps with the saved lr, betas, eps and weight decay, not its own construction's.
//
// - Adam-format checkpoints (FusedAdam, CPU Adam, the swapped Adam, Lamb and the 1-bit types,
//   whose groups carry torch::optim::AdamWOptions) write each group's options as JSON into every
//   rank's optim-states file: metadata key "param_groups", [{"lr", "betas", "eps",
//   "weight_decay", "amsgrad"}] in the optimizer's group order; the other fragment formats
//   likewise with their optimizer's keys (Lion: lr, betas, weight_decay; Adagrad: lr, lr_decay,
//   weight_decay, initial_accumulator_value, eps; SGD: lr, momentum, dampening, weight_decay,
//   nesterov; a group of another options type: {"lr"} alone). Absent in checkpoints saved
//   before it: the engine's own options stay.
// - A non-Adam optimizer's libtorch archive (`optimizer_archive`) already holds each group's
//   options (param_groups/<g>/options), which libtorch's Optimizer::load reads past: they are
//   read from it here.
// Either way the loaded options replace the groups' before the LR scheduler's state is loaded, so
// a scheduler still sets the lr (as DeepSpeed's do). The optimizers read their groups' options
// at every step (FusedAdam, its set_flat segments and prepare_step ranges, the swapped Adam), so
// nothing else needs telling.
#pragma once
#include <torch/optim/optimizer.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace deepspeed {
namespace checkpoint {

// The optim-states file's metadata key.
constexpr const char* kParamGroupsKey = "param_groups";

// One JSON object per parameter group of `optimizer`.
nlohmann::json group_options_json(torch::optim::Optimizer& optimizer);

// Options for every group of `optimizer`, in order, to hand to set_group_options.
using GroupOptions = std::vector<std::unique_ptr<torch::optim::OptimizerOptions>>;

// Each group's current options with the saved JSON's keys laid over. REQUIRES: `saved` is an
// array with one entry per group (the caller names a different count). Throws CheckpointError
// naming `source`, the group and the key when a value is malformed.
GroupOptions group_options_from_json(const nlohmann::json& saved,
                                     torch::optim::Optimizer& optimizer, const std::string& source);

// What a libtorch optimizer archive holds of its parameter groups (torch/optim/serialize.h:
// "param_groups/size", then each group's "params/size" and "options"), read in one pass.
struct ArchiveGroups {
  // Tensors per saved group; empty when the archive is not in libtorch's layout (another
  // optimizer's own serialisation).
  std::vector<int64_t> sizes;
  // Each group's options read into `optimizer`'s option types (its param_groups/<g>/options);
  // empty when the group count differs or they do not read: the engine's options stay.
  GroupOptions options;
};
ArchiveGroups read_archive_groups(const std::string& archive_bytes,
                                  torch::optim::Optimizer& optimizer);

// Replaces the groups' options. REQUIRES: one per group (or none: nothing changes).
void set_group_options(torch::optim::Optimizer& optimizer, GroupOptions options);

}  // namespace checkpoint
}  // namespace deepspeed
