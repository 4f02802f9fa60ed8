// The split layers of deepspeed/tp.h. Each is built by drawing the unsplit layer (same RNG
// consumption, same values) and keeping this rank's slice.
#include <torch/torch.h>

#include <unordered_map>
#include <unordered_set>

#include "deepspeed/tp.h"
#include "tp/mappings.h"

namespace deepspeed {
namespace tp {
namespace {

void copy_into(at::Tensor& dst, const at::Tensor& src, const char* what) {
  if (!src.sizes().equals(dst.sizes()))
    throw ConfigError(std::string("tensor parallelism: ") + what + " slice has shape " +
                      c10::str(src.sizes()) + ", the layer expects " + c10::str(dst.sizes()));
  torch::NoGradGuard no_grad;
  dst.copy_(src);
}

}  // namespace

std::vector<at::Tensor> split_parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  std::unordered_set<const void*> seen;
  for (const auto& m : module.modules(/*include_self=*/true))
    if (const auto* layer = dynamic_cast<const SplitLayer*>(m.get()))
      for (auto& p : layer->split_parameters())
        if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, SplitDim>> split_parameter_dims(
    const torch::nn::Module& module) {
  std::unordered_map<const void*, SplitDim> dims;
  for (const auto& m : module.modules(/*include_self=*/true))
    if (const auto* layer = dynamic_cast<const SplitLayer*>(m.get()))
      for (auto& p : layer->split_parameters()) dims[p.unsafeGetTensorImpl()] = layer->split_dim(p);
  // named_parameters() lists a tensor under every name it is registered with (a tied head).
  std::vector<std::pair<std::string, SplitDim>> out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    auto it = dims.find(p.value().unsafeGetTensorImpl());
    if (it != dims.end()) out.emplace_back(p.key(), it->second);
  }
  return out;
}

// ---- ColumnParallelLinear ----

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const ColumnParallelLinearOptions& options,
                                                   comm::CommunicatorPtr group)
    : options_(options), group_(std::move(group)) {
  if (options_.fused_parts < 1 || options_.out_features % options_.fused_parts != 0)
    throw ConfigError(
        "ColumnParallelLinear: out_features (" + std::to_string(options_.out_features) +
        ") is not divisible by fused_parts (" + std::to_string(options_.fused_parts) + ")");
  split_range(options_.out_features / options_.fused_parts, group_->world_size(), group_->rank(),
              "ColumnParallelLinear out_features per fused part");
  torch::nn::Linear full(
      torch::nn::LinearOptions(options_.in_features, options_.out_features).bias(options_.bias));
  weight = register_parameter("weight", slice_rows(full->weight.detach()).clone());
  if (options_.bias) bias = register_parameter("bias", slice_rows(full->bias.detach()).clone());
}

at::Tensor ColumnParallelLinearImpl::slice_rows(const at::Tensor& full) const {
  const int64_t parts = options_.fused_parts, per_part = full.size(0) / parts;
  const Range r = split_range(per_part, group_->world_size(), group_->rank(),
                              "ColumnParallelLinear rows per fused part");
  auto shape = full.sizes().vec();
  std::vector<int64_t> blocks{parts, per_part};
  blocks.insert(blocks.end(), shape.begin() + 1, shape.end());
  shape[0] = parts * r.size();
  return full.reshape(blocks).narrow(1, r.begin, r.size()).reshape(shape);
}

void ColumnParallelLinearImpl::set_from_full(const at::Tensor& w, const at::Tensor& b) {
  copy_into(weight, slice_rows(w), "ColumnParallelLinear weight");
  if (bias.defined() && b.defined()) copy_into(bias, slice_rows(b), "ColumnParallelLinear bias");
}

std::vector<at::Tensor> ColumnParallelLinearImpl::split_parameters() const {
  std::vector<at::Tensor> out{weight};
  if (bias.defined()) out.push_back(bias);
  return out;
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  at::Tensor y = torch::nn::functional::linear(copy_to_region(x, group_), weight, bias);
  return options_.gather_output ? gather_from_region(y, group_) : y;
}

// ---- RowParallelLinear ----

RowParallelLinearImpl::RowParallelLinearImpl(const RowParallelLinearOptions& options,
                                             comm::CommunicatorPtr group)
    : options_(options), group_(std::move(group)) {
  split_range(options_.in_features, group_->world_size(), group_->rank(),
              "RowParallelLinear in_features");
  torch::nn::Linear full(
      torch::nn::LinearOptions(options_.in_features, options_.out_features).bias(options_.bias));
  weight = register_parameter("weight", slice_columns(full->weight.detach()).clone());
  if (options_.bias) bias = register_parameter("bias", full->bias.detach().clone());
}

at::Tensor RowParallelLinearImpl::slice_columns(const at::Tensor& full) const {
  const Range r = split_range(full.size(-1), group_->world_size(), group_->rank(),
                              "RowParallelLinear in_features");
  return full.narrow(-1, r.begin, r.size());
}

void RowParallelLinearImpl::set_from_full(const at::Tensor& w, const at::Tensor& b) {
  copy_into(weight, slice_columns(w), "RowParallelLinear weight");
  if (bias.defined() && b.defined()) copy_into(bias, b, "RowParallelLinear bias");
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x) {
  const at::Tensor in = options_.input_is_parallel ? x : scatter_to_region(x, group_);
  at::Tensor y = reduce_from_region(torch::nn::functional::linear(in, weight), group_);
  return bias.defined() ? y + bias : y;
}

// ---- VocabParallelEmbedding ----

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t num_embeddings,
                                                       int64_t embedding_dim,
                                                       comm::CommunicatorPtr group)
    : range_(split_range(num_embeddings, group->world_size(), group->rank(),
                         "VocabParallelEmbedding vocabulary")),
      group_(std::move(group)) {
  torch::nn::Embedding full(num_embeddings, embedding_dim);
  weight = register_parameter("weight",
                              full->weight.detach().narrow(0, range_.begin, range_.size()).clone());
}

void VocabParallelEmbeddingImpl::set_from_full(const at::Tensor& w) {
  copy_into(weight, w.narrow(0, range_.begin, range_.size()), "VocabParallelEmbedding weight");
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  if (group_->world_size() == 1) return torch::embedding(weight, ids);
  // Ids of other ranks' rows look up row 0 and are zeroed: this rank adds nothing for them.
  const at::Tensor outside = (ids < range_.begin) | (ids >= range_.end);
  const at::Tensor local = (ids - range_.begin).masked_fill(outside, 0);
  at::Tensor e = torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduce_from_region(e, group_);
}

}  // namespace tp
}  // namespace deepspeed
