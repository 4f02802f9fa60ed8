// init_inference: AutoTP placement (auto_tp.h) applied in place, weights read slice by slice
// (shard_loader.h), and the row layers' all-reduce behind deepspeed::tp::linear.
#include "deepspeed/inference.h"

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "comm/launch_world.h"
#include "deepspeed/errors.h"
#include "deepspeed/topology.h"
#include "deepspeed/tp.h"
#include "deepspeed/zero_unit.h"
#include "tp/auto_tp.h"
#include "tp/shard_loader.h"
#include "util/text.h"

namespace deepspeed {
namespace {

// What tp::linear needs for a row-parallel weight: its group, and for the LM head where its
// columns start (its input arrives whole).
struct RowSplit {
  // The weight, held weakly: the entry lives exactly as long as the weight (its TensorImpl's
  // address is the key; a weak reference keeps that address from being reused while the entry
  // exists). The model stays split after the engine is gone (DeepSpeed swaps LinearAllreduce
  // modules into the model, which own their group), so the communication must not end with
  // the engine: a discarded init_inference result left every row layer returning its rank's
  // partial sums.
  using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  WeakImpl weight;
  comm::CommunicatorPtr group;  // held strongly, for as long as the weight
  int64_t input_begin = -1;     // >= 0 (the LM head): x's columns [begin, begin + in / tp)
};

// Row-parallel weights -> their split. Written by init_inference (entries added, those of dead
// weights dropped) and the engine's destructor (dead ones dropped); read by every tp::linear
// call (any thread).
struct RowRegistry {
  std::mutex mu;
  std::unordered_map<const void*, RowSplit> rows;

  // REQUIRES: mu held. Drops the entries of weights that no longer exist (and with them their
  // hold on the group).
  void drop_dead() {
    for (auto it = rows.begin(); it != rows.end();)
      it = it->second.weight.expired() ? rows.erase(it) : std::next(it);
  }
};
RowRegistry& registry() {
  static RowRegistry r;
  return r;
}

class AutoTPEngine : public InferenceEngine {
 public:
  AutoTPEngine(std::shared_ptr<torch::nn::Module> model, comm::CommunicatorPtr group,
               std::vector<ShardedLinear> sharded)
      : model_(std::move(model)), group_(std::move(group)), sharded_(std::move(sharded)) {}
  ~AutoTPEngine() override {
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().drop_dead();  // the model may have died first
  }
  torch::nn::Module& module() override { return *model_; }
  const comm::CommunicatorPtr& tp_group() const override { return group_; }
  const std::vector<ShardedLinear>& sharded() const override { return sharded_; }

 private:
  std::shared_ptr<torch::nn::Module> model_;
  comm::CommunicatorPtr group_;
  std::vector<ShardedLinear> sharded_;
};

std::string shape_str(const std::vector<int64_t>& s) { return c10::str(at::IntArrayRef(s)); }

// What one tensor of the model becomes on this rank: which slice of which whole shape.
struct Slice {
  enum { kWhole, kRows, kColumns } how = kWhole;
  int parts = 1;
  tp::Range range;
  std::vector<int64_t> whole;
};

// The refusals come before anything is changed.
void check_divisible(const std::vector<tp::Placement>& plan, int tp_size, int64_t head_dim) {
  for (const auto& p : plan) {
    // A fused q/k/v is cut into three equal blocks, q, k and v, which holds only when each is as
    // wide as the input (out = 3 x in). A grouped- or multi-query projection (k and v narrower
    // than q) would be cut across q, k and v: every rank would hold wrong heads, silently.
    const auto& shape = p.layer.full_shape;
    if (tp_size > 1 && p.layer.fused_parts == 3 && shape[0] != 3 * shape[1])
      throw ConfigError("init_inference: fused q/k/v layer " + p.layer.name + " has " +
                        std::to_string(shape[0]) + " output features for " +
                        std::to_string(shape[1]) + " input features, not 3 x " +
                        std::to_string(shape[1]) +
                        ": AutoTP splits a fused q/k/v into three equal blocks, and a "
                        "grouped- or multi-query projection (k and v narrower than q) would be "
                        "cut across them. Give the model separate q, k and v Linear layers, or "
                        "use tp_size 1");
    const auto& s = p.layer.full_shape;
    const bool column = p.layer.kind == ShardedLinear::kColumn;
    const std::string what =
        std::string(column ? "column" : "row") + "-parallel layer " + p.layer.name;
    const int64_t split = column ? s[0] / p.layer.fused_parts : s[1];
    if ((column && s[0] % p.layer.fused_parts) || split % tp_size)
      throw ConfigError("init_inference: tp_size " + std::to_string(tp_size) + " does not divide " +
                        (column ? "the output features" : "the input features") + " (" +
                        std::to_string(split) + (p.layer.fused_parts > 1 ? " per q/k/v" : "") +
                        ") of " + what);
    // Every rank must hold whole heads: tp_size dividing the features is not enough (6 heads of
    // 8 at tp 4 give each rank 12 features, 1.5 heads, and the attention's reshape fails in the
    // first forward, naming nothing). A layer counts as attention as in DeepSpeed's
    // get_shard_size: its name does not contain "mlp", it is not the LM head, and its split
    // dimension is whole heads. DeepSpeed then gives the ranks unequal numbers of heads; here
    // the split is even, so it is refused.
    if (head_dim > 0 && tp_size > 1 && !p.whole_input &&
        p.layer.name.find("mlp") == std::string::npos && split % head_dim == 0 &&
        (split / head_dim) % tp_size)
      throw ConfigError("init_inference: tp_size " + std::to_string(tp_size) +
                        " does not divide the " + std::to_string(split / head_dim) +
                        " heads (head_dim " + std::to_string(head_dim) + ", " +
                        std::to_string(split) + " features" +
                        (p.layer.fused_parts > 1 ? " per q/k/v" : "") + ") of " + what +
                        ": each rank holds whole heads, the same number on every rank (DeepSpeed "
                        "would give the ranks unequal numbers of heads); use a tp_size that "
                        "divides the heads");
  }
}

// A tag names a tag folder of a training checkpoint; anywhere else it would be ignored.
void check_tag(const InferenceConfig& config) {
  if (config.tag.empty()) return;
  if (config.checkpoint.empty())
    throw ConfigError("init_inference: InferenceConfig::tag \"" + config.tag +
                      "\" is given without InferenceConfig::checkpoint: a tag names a tag folder "
                      "of a training checkpoint; set the checkpoint or remove the tag");
  std::error_code ec;
  if (ends_with(config.checkpoint, ".safetensors") ||
      std::filesystem::is_regular_file(config.checkpoint, ec))
    throw ConfigError("init_inference: InferenceConfig::tag \"" + config.tag +
                      "\" is given with the weights file '" + config.checkpoint +
                      "', which has no tags (a tag names a tag folder of a training "
                      "checkpoint); remove the tag");
}

class Loader {
 public:
  Loader(const InferenceConfig& config, const comm::Communicator& group)
      : config_(config), rank_(group.rank()), size_(group.world_size()) {
    if (!config.checkpoint.empty()) src_ = tp::open_weights(config.checkpoint, config.tag);
  }

  // This rank's value of model tensor `name` (currently `t`), whole shape `slice.whole`.
  at::Tensor value(const std::string& name, const at::Tensor& t, Slice slice) {
    if (slice.how != Slice::kWhole)
      slice.range =
          tp::split_range(slice.how == Slice::kRows ? slice.whole[0] / slice.parts : slice.whole[1],
                          size_, rank_, name.c_str());
    if (!src_) return slice_in_memory(t, slice);
    const std::string stored = find(name, slice.whole);
    switch (slice.how) {
      case Slice::kRows:
        return tp::read_rows(*src_, stored, slice.whole, slice.parts, slice.range);
      case Slice::kColumns:
        return tp::read_columns(*src_, stored, slice.whole, slice.range);
      default:
        return tp::read_whole(*src_, stored, slice.whole,
                              t.is_floating_point() ? at::kFloat : t.scalar_type());
    }
  }

 private:
  static at::Tensor slice_in_memory(const at::Tensor& t, const Slice& s) {
    if (s.how == Slice::kColumns) return t.narrow(1, s.range.begin, s.range.size()).clone();
    if (s.how == Slice::kWhole) return t;
    std::vector<int64_t> blocks{s.parts, t.size(0) / s.parts};
    blocks.insert(blocks.end(), t.sizes().begin() + 1, t.sizes().end());
    auto shape = t.sizes().vec();
    shape[0] = s.parts * s.range.size();
    return t.reshape(blocks).narrow(1, s.range.begin, s.range.size()).reshape(shape).clone();
  }

  // The checkpoint's name for `name`, its shape checked against the model's.
  std::string find(const std::string& name, const std::vector<int64_t>& whole) {
    std::vector<std::string> tried =
        config_.checkpoint_names ? config_.checkpoint_names(name) : std::vector<std::string>{name};
    for (const auto& candidate : tried) {
      auto shape = src_->shape(candidate);
      if (!shape) continue;
      if (*shape != whole)
        throw CheckpointError("init_inference: tensor \"" + candidate + "\" of '" + src_->path() +
                              "' has shape " + shape_str(*shape) + ", the model's is " +
                              shape_str(whole) + " (a checkpoint of another architecture?)");
      return candidate;
    }
    std::string names;
    for (const auto& c : tried) names += (names.empty() ? "\"" : ", \"") + c + "\"";
    throw CheckpointError("init_inference: '" + src_->path() + "' has no tensor " + names +
                          " for the model's \"" + name +
                          "\" (a checkpoint of another architecture?)");
  }

  const InferenceConfig& config_;
  int rank_, size_;
  std::unique_ptr<tp::WeightSource> src_;
};

// Without a comm or init_distributed(), a launched job is joined here (comm/launch_world.h).
comm::CommunicatorPtr world_of(const InferenceConfig& config) {
  return comm::world_or_launch("init_inference()", config.comm);
}

// The first registered parameter or buffer still in DeferredInit placeholder memory ("" if none).
std::string first_placeholder(torch::nn::Module& model) {
  for (auto& item : model.named_parameters())
    if (inference::is_deferred(item.value())) return item.key();
  for (auto& item : model.named_buffers())
    if (inference::is_deferred(item.value())) return item.key();
  return "";
}

}  // namespace

std::shared_ptr<InferenceEngine> init_inference(std::shared_ptr<torch::nn::Module> model,
                                                InferenceConfig config) {
  if (!model) throw ConfigError("init_inference: the model is null");
  if (inference::DeferredInit::active())
    throw ConfigError(
        "init_inference: called inside an inference::DeferredInit scope (its tensors would be "
        "placeholders too); end the scope once the model is built");
  if (config.checkpoint.empty())
    if (const auto name = first_placeholder(*model); !name.empty())
      throw ConfigError("init_inference: \"" + name +
                        "\" was built under inference::DeferredInit (placeholder memory, no "
                        "values) and no checkpoint was given: set InferenceConfig::checkpoint");
  check_tag(config);
  if (config.head_dim < 0)
    throw ConfigError("init_inference: InferenceConfig::head_dim " +
                      std::to_string(config.head_dim) + " is negative (0: not checked)");
  if (config.dtype != at::kFloat && config.dtype != at::kBFloat16)
    throw ConfigError("init_inference: dtype " + std::string(c10::toString(config.dtype)) +
                      " is not supported (float or bfloat16)");
  const auto world = world_of(config);
  if (config.tp_size < 1 || world->world_size() % config.tp_size != 0)
    throw ConfigError("init_inference: tp_size " + std::to_string(config.tp_size) +
                      " does not divide the world size " + std::to_string(world->world_size()));
  comm::Topology topology(world, {1, config.tp_size});
  const auto group = topology.tensor_parallel();
  const auto plan = tp::autotp_plan(*model);
  check_divisible(plan, config.tp_size, config.head_dim);
  // Nothing to split (no block found: AutoTP's blocks need a LayerNorm, so an RMSNorm model has
  // none): every rank runs the whole model. Correct, but not what tp_size asked for: said once.
  if (config.tp_size > 1 && plan.empty() && world->rank() == 0)
    std::fprintf(stderr,
                 "[deepspeed] warning: init_inference: tp_size %d, but AutoTP found no "
                 "transformer block in the model (%s): a block needs at least two Linear layers "
                 "and a torch::nn::LayerNorm below it (an RMSNorm is not one). Nothing is split; "
                 "every rank holds and runs the whole model\n",
                 config.tp_size, model->name().c_str());

  // Each parameter's slice: the Linear layers of the plan split, everything else whole.
  std::unordered_map<std::string, Slice> slices;
  std::vector<ShardedLinear> sharded;
  for (const auto& p : plan) {
    const auto& s = p.layer.full_shape;
    const bool column = p.layer.kind == ShardedLinear::kColumn;
    slices[p.layer.name + ".weight"] =
        column ? Slice{Slice::kRows, p.layer.fused_parts, {}, s} : Slice{Slice::kColumns, 1, {}, s};
    slices[p.layer.name + ".bias"] = column ? Slice{Slice::kRows, p.layer.fused_parts, {}, {s[0]}}
                                            : Slice{Slice::kWhole, 1, {}, {s[0]}};
    sharded.push_back(p.layer);
  }
  Loader loader(config, *group);
  torch::NoGradGuard no_grad;
  std::unordered_set<const void*> done;  // a tensor registered under two names is loaded once
  auto load = [&](const std::string& name, at::Tensor& t) {
    if (!done.insert(t.unsafeGetTensorImpl()).second) return;
    auto it = slices.find(name);
    Slice slice = it != slices.end() ? it->second : Slice{Slice::kWhole, 1, {}, t.sizes().vec()};
    at::Tensor v = loader.value(name, t, slice);
    t.set_data(t.is_floating_point() ? v.to(config.dtype) : v.to(t.scalar_type()));
  };
  for (auto& item : model->named_parameters()) load(item.key(), item.value());
  for (auto& item : model->named_buffers()) load(item.key(), item.value());

  // A safety net: loading replaced every registered tensor or threw. A placeholder left would
  // run as garbage, so it is refused by name.
  if (const auto name = first_placeholder(*model); !name.empty())
    throw CheckpointError("init_inference: \"" + name + "\" is still DeferredInit placeholder " +
                          "memory after loading '" + config.checkpoint + "'");

  if (config.tp_size > 1) {
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().drop_dead();
    for (const auto& p : plan) {
      if (p.layer.kind != ShardedLinear::kRow) continue;
      const at::Tensor& w = p.linear->weight;
      RowSplit split{RowSplit::WeakImpl(w.getIntrusivePtr()), group, -1};
      if (p.whole_input)  // the LM head: this rank's columns of its whole input
        split.input_begin = tp::split_range(p.layer.full_shape[1], group->world_size(),
                                            group->rank(), p.layer.name.c_str())
                                .begin;
      registry().rows.insert_or_assign(w.unsafeGetTensorImpl(), std::move(split));
    }
  }
  model->eval();
  return std::make_shared<AutoTPEngine>(model, group, std::move(sharded));
}

namespace tp {

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  comm::CommunicatorPtr group;
  int64_t input_begin = -1;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    // A hit is this weight: the entry's weak reference keeps a dead weight's address unused.
    auto it = registry().rows.find(weight.unsafeGetTensorImpl());
    if (it != registry().rows.end()) {
      group = it->second.group;
      input_begin = it->second.input_begin;
    }
  }
  if (!group) return zero::linear(x, weight, bias);
  // The LM head's input is whole: this rank's columns of it meet this rank's columns of W.
  const at::Tensor in = input_begin >= 0 ? x.narrow(-1, input_begin, weight.size(1)) : x;
  at::Tensor y = reduce_from_region(zero::linear(in, weight, {}), group);
  return bias.defined() ? y + bias : y;
}

}  // namespace tp
}  // namespace deepspeed
