// deepspeed.init_inference: a trained model sharded over a tensor-parallel group by DeepSpeed's
// AutoTP rule, its weights read from a training checkpoint, each rank reading only its slices.
//
// AutoTP (DeepSpeed's, for a module tree not known in advance): a *block* (a transformer layer)
// has at least two Linear layers and a LayerNorm below it; where such modules repeat (siblings
// with the same parameter names and shapes: a stack of layers) the outermost repeated ones are
// the blocks, else (one layer) the innermost ones with a LayerNorm child.
// Inside a block, in registration order, a Linear is
//   row-parallel     when its name ends in a row name (o_proj, out_proj, dense_4h_to_h,
//                    down_proj, fc2, c_proj, wo, attention.dense, attn.dense,
//                    self_attention.dense), or it comes right before a LayerNorm,
//                    or it is the block's last Linear: the attention output and MLP down
//                    projections. Its weight keeps the input columns of this rank; one
//                    all-reduce follows it, the bias is added once, after it;
//   column-parallel  otherwise (q/k/v, MLP up/gate): its weight keeps the output rows of this
//                    rank, no communication. A fused q/k/v (name ending in qkv, c_attn,
//                    query_key_value, Wqkv, qkv_proj) has q, k and v split each on its own.
// Linear layers outside blocks (the LM head) and embeddings stay whole (DeepSpeed's default).
//
// C++ modules have no forward hooks, so the row layers' all-reduce lives in the function the
// model's Linear layers must run through: deepspeed::tp::linear (below), or
// deepspeed::zero::linear is NOT enough. The model must also derive its local head count from
// its q/k/v weight (rows / 3 / head_dim), as the example GPT does; init_inference cannot edit a
// module's private head count (DeepSpeed's Python AutoTP patches num_heads attributes).
#pragma once
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "deepspeed/comm.h"

namespace deepspeed {

struct InferenceConfig {
  int tp_size = 1;                    // tensor-parallel degree; must divide the world size
  at::ScalarType dtype = at::kFloat;  // kFloat or kBFloat16: parameters and buffers after loading
  // A training checkpoint (a save folder: its `latest` tag, or `tag`; or a tag folder) of any
  // ZeRO stage, world size or pipeline layout, or a ds_to_fp32 .safetensors file. Empty: the
  // module's own weights are sharded (every rank must hold the same, e.g. seeded alike).
  std::string checkpoint;
  std::string tag;
  // The names a model tensor may have in the checkpoint, tried in order (default: its own name).
  // A pipeline checkpoint names layers layer_XX.*: the model supplies that mapping.
  std::function<std::vector<std::string>(const std::string&)> checkpoint_names;
  comm::CommunicatorPtr comm;  // the world; default init_distributed()'s, else single process
};

// How init_inference placed one Linear layer.
struct ShardedLinear {
  std::string name;
  enum Kind { kColumn, kRow } kind = kColumn;
  int fused_parts = 1;
  std::vector<int64_t> full_shape;  // the unsplit weight's [out, in]
};

class InferenceEngine {
 public:
  virtual ~InferenceEngine() = default;
  virtual torch::nn::Module& module() = 0;
  // This rank's tensor-parallel group (size tp_size: consecutive ranks).
  virtual const comm::CommunicatorPtr& tp_group() const = 0;
  virtual const std::vector<ShardedLinear>& sharded() const = 0;
};

// Shards `model` in place (AutoTP), loads the checkpoint's slices, casts to config.dtype and
// sets eval mode. COLLECTIVE over the world (builds the tensor-parallel groups). Throws
// ConfigError naming the layer and sizes when tp_size does not divide a split dimension, and
// CheckpointError naming the tensor when the checkpoint lacks one or holds it with another shape
// (another architecture). The model's row layers communicate until the engine is destroyed.
std::shared_ptr<InferenceEngine> init_inference(std::shared_ptr<torch::nn::Module> model,
                                                InferenceConfig config);

namespace tp {
// The Linear forward AutoTP can shard: deepspeed::zero::linear (ZeRO-3's), and for a weight
// init_inference made row-parallel, x W_r^T all-reduced over its group, then + bias. Inference
// only (the row all-reduce is differentiable, the column layers' input-gradient all-reduce is
// not placed). COLLECTIVE for row-parallel weights.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});
}  // namespace tp

}  // namespace deepspeed
