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
//                    self_attn.dense, self_attention.dense), or it comes right before a
//                    LayerNorm, or it is the block's last Linear: the attention output and MLP
//                    down projections. Its weight keeps the input columns of this rank; one
//                    all-reduce follows it, the bias is added once, after it;
//   column-parallel  otherwise (q/k/v, MLP up/gate): its weight keeps the output rows of this
//                    rank, no communication. A fused q/k/v (name ending in qkv, c_attn,
//                    query_key_value, Wqkv, qkv_proj) has q, k and v split each on its own.
// The LM head (a Linear child of the model named lm_head or embed_out, DeepSpeed's names, or
// head) is row-parallel too, its whole input cut to this rank's columns first (DeepSpeed's
// LmHeadLinearAllreduce); one whose weight is also registered under another name (tied to the
// token embedding) stays whole (differs: DeepSpeed gives the head a cut copy, untying it).
// Other Linear layers outside blocks and the embeddings stay whole (as DeepSpeed's AutoTP).
// Every split is even: tp_size must divide each split dimension and, with head_dim given, the
// heads of each attention layer (differs: DeepSpeed shards unevenly, by kv heads or in 64-element
// grains, when tp_size does not divide them).
//
// Differs from / absent from DeepSpeed's init_inference (DeepSpeedInferenceConfig): the config
// is this C++ struct, so an option it lacks cannot be given (nothing is silently ignored).
// dtype defaults to fp32 (DeepSpeed: fp16) and fp16 is refused (CPU inference). Not provided:
// replace_with_kernel_inject (fused inference kernels), injection_policy (a user's row-layer
// names: AutoTP's rule only), max_out_tokens / min_out_tokens (the model keeps its own KV cache),
// quant (int8 weights), enable_cuda_graph, an mpu / tp_group of the caller's (the groups are
// consecutive ranks of `comm`), moe, and a checkpoint JSON descriptor (`checkpoint` is a folder,
// a .safetensors file or a torch.save state dict here).
//
// Building the model without holding it (DeepSpeed's `with deepspeed.OnDevice(dtype,
// device="meta")`): libtorch's C++ modules have no device argument and their constructors fill
// every parameter at random (reset()), so a model built the ordinary way costs each rank the
// whole model before init_inference keeps 1/tp_size of it. Build it inside an
// inference::DeferredInit scope instead (below): its storage is placeholder memory, and
// init_inference allocates real memory only for this rank's slices as it reads them.
//
//     std::shared_ptr<MyModel> model;
//     {
//       deepspeed::inference::DeferredInit deferred;  // this thread's CPU tensors: placeholders
//       model = std::make_shared<MyModel>(cfg);       // any module tree, built as usual
//     }
//     auto engine = deepspeed::init_inference(model, {.tp_size = 2, .checkpoint = dir});
//
// A scope rather than a builder callback that builds and shards block by block: the callback
// would peak lower (one block) but init_inference would have to know how the model is assembled,
// which AutoTP exists not to need; the scope works on any module tree whose constructors run
// unchanged (docs/decisions.md, issue 19).
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
  int tp_size = 1;  // tensor-parallel degree; must divide the world size
  // kFloat (default; DeepSpeed's is fp16) or kBFloat16: parameters and buffers after loading.
  // kHalf is refused (ConfigError).
  at::ScalarType dtype = at::kFloat;
  // The width of one attention head (0, default: not known, not checked). Given, init_inference
  // refuses a tp_size that does not divide the heads of an attention layer (a split layer whose
  // name does not contain "mlp" and whose split dimension is a multiple of head_dim; not the LM
  // head), naming the layer and the heads; without it such a model fails in its first forward.
  int64_t head_dim = 0;
  // A training checkpoint (a save folder: its `latest` tag, or `tag`; or a tag folder) of any
  // ZeRO stage, world size or pipeline layout, a .safetensors file, any other file as a
  // torch.save state dict (pytorch_model.bin of ds_to_fp32, save_16bit_model or PyTorch; read by
  // a restricted reader that runs no code, as torch.load(weights_only=True)), or a ds_to_fp32
  // output folder (its index and shards, or its one file). Empty: the
  // module's own weights are sharded (every rank must hold the same, e.g. seeded alike).
  std::string checkpoint;
  // A tag folder of the save folder `checkpoint` (default: the one its `latest` names). With a
  // weights file or no checkpoint it would mean nothing: ConfigError naming it.
  std::string tag;
  // The names a model tensor may have in the checkpoint, tried in order (default: its own name).
  // A pipeline checkpoint names layers layer_XX.*: the model supplies that mapping.
  std::function<std::vector<std::string>(const std::string&)> checkpoint_names;
  // The world; default init_distributed()'s, which is called here when the launcher's
  // environment says this process is one of several (as initialize()), else single process.
  comm::CommunicatorPtr comm;
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
// (another architecture), and ConfigError naming tag / head_dim (see InferenceConfig). The model
// stays split and correct after the engine is destroyed: its row layers' group is held for as
// long as their weights live, so the result may be dropped. A copy of the split model
// (Module::clone) holds new tensors, which are not registered: its row layers would not
// all-reduce.
// A model built under inference::DeferredInit needs config.checkpoint (ConfigError naming a
// placeholder tensor otherwise) and every registered parameter and buffer must come from it
// (CheckpointError naming the one that does not). REQUIRES: no DeferredInit scope is alive on
// this thread (ConfigError).
std::shared_ptr<InferenceEngine> init_inference(std::shared_ptr<torch::nn::Module> model,
                                                InferenceConfig config);

namespace inference {

// While alive, every CPU tensor storage this thread allocates is placeholder memory: each one its
// own virtual range, all of them mapped onto the same few physical pages (one memfd as large as
// the largest request), so building a model of any size costs about one of its tensors. The
// values are garbage (every tensor aliases every other), which is fine for the random init that
// module constructors write and init_inference then replaces; it is NOT fine for construction
// code that reads tensors it computed (indices, data-dependent shapes, item()): such a tensor,
// and any registered buffer the checkpoint does not hold, must be computed after init_inference.
// Unregistered member tensors built in the scope stay placeholders: init_inference cannot see
// them. The placeholders' pages are released now and then (their page-table entries dropped) so
// the resident set counts about two of the largest tensors, not every alias.
//
// Thread-safety: c10's CPU allocator is one per process. The first live scope installs a
// routing allocator (at the installed one's priority, see tp/deferred_init.h) that gives
// placeholders only to threads inside a scope and passes every other thread's requests to the
// allocator it replaced; the last scope to end restores that one (also when the scope ends by
// an exception). Scopes may nest and may live on several threads at once (ranks as threads).
// An allocator installed by someone else while a scope is alive stays installed. Only the
// thread's own requests count: intra-op worker threads allocate real memory.
class DeferredInit {
 public:
  DeferredInit();
  ~DeferredInit();
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;
  // Whether a scope is alive on this thread.
  static bool active();
};

// Whether `t`'s storage is DeferredInit placeholder memory (not yet loaded by init_inference).
bool is_deferred(const at::Tensor& t);

}  // namespace inference

namespace tp {
// The Linear forward AutoTP can shard: deepspeed::zero::linear (ZeRO-3's), and for a weight
// init_inference made row-parallel, x W_r^T all-reduced over its group, then + bias (for the LM
// head x arrives whole: this rank's columns of x first). Inference only (the row all-reduce is
// differentiable, the column layers' input-gradient all-reduce is not placed). COLLECTIVE for
// row-parallel weights. Thread-safe.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});
}  // namespace tp

}  // namespace deepspeed
