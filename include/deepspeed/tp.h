// Tensor-parallel layers (Megatron-LM's, as DeepSpeed trains with them): one layer's weight split
// across the ranks of a tensor-parallel group, with the collectives Megatron places.
//
//   ColumnParallelLinear   Y = X A, A split by output columns: rank r holds A_r and computes
//                          Y_r = X A_r. Forward: identity on X; backward: all-reduce of dL/dX
//                          (every rank's A_r contributed to it). With gather_output the Y_r are
//                          all-gathered along the last dimension (backward: keep this rank's
//                          slice).
//   RowParallelLinear      Y = X A, A split by input rows: X arrives split along its last
//                          dimension (a column layer's output), rank r computes X_r A_r and the
//                          partial sums are all-reduced (forward); backward is the identity. The
//                          bias is replicated and added after the all-reduce.
//   VocabParallelEmbedding rows [r V/N, (r+1) V/N) of the table on rank r; ids outside are looked
//                          up as zeros, the partial embeddings all-reduced (forward; backward
//                          identity).
//   vocab_parallel_cross_entropy  the loss over logits split by vocabulary: an all-reduce of the
//                          row max, then one of the sum of exponentials and the target logit
//                          (stacked); no rank holds the whole [tokens, V] logits.
//
// Initialisation: every split weight equals the slice of the unsplit layer's weight built with
// the same generator state: each rank draws the whole weight (torch::nn::Linear's / Embedding's
// own initialisation) and keeps its slice, so the RNG advances as for the unsplit layer and a
// model built from these layers on every rank with one seed equals the single-rank model. A
// later initialisation (GPT-2's N(0, 0.02) over the whole model) goes through
// set_from_full()/init_full(), which do the same.
//
// Collectives: forward and backward of every layer are COLLECTIVE over the tensor-parallel
// group (same layers, same order, same shapes on every rank of the group). A layer keeps its
// communicator alive for as long as the layer lives; autograd graphs must not outlive the layer.
// Group of size 1: plain layers, no communication.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace tp {

// ---- the communication mappings (Megatron's mpu/mappings.py), differentiable ----
// Identity forward, all-reduce (sum) of the gradient backward.
at::Tensor copy_to_region(const at::Tensor& x, const comm::CommunicatorPtr& group);
// All-reduce (sum) forward, identity backward.
at::Tensor reduce_from_region(const at::Tensor& x, const comm::CommunicatorPtr& group);
// All-gather along the last dimension forward (rank r's slice r), split backward.
at::Tensor gather_from_region(const at::Tensor& x, const comm::CommunicatorPtr& group);
// This rank's slice of the last dimension forward, all-gather backward.
at::Tensor scatter_to_region(const at::Tensor& x, const comm::CommunicatorPtr& group);

// Which rows [begin, end) of `size` rank `rank` of `parts` holds. Throws ConfigError naming
// `what` and the values when parts does not divide size.
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
Range split_range(int64_t size, int parts, int rank, const char* what);

// How a split parameter was cut from the unsplit one: along dimension `dim`, each of `parts`
// equal blocks stacked along it (a fused q/k/v: 3) split on its own, rank r of N keeping block
// slice r of every block, in block order. Checkpoints record it to merge the slices back.
struct SplitDim {
  int dim = 0;
  int parts = 1;
};

// A layer whose parameters are (partly) split over a tensor-parallel group. The engine finds
// these in the module tree (split_parameters below) to count norms right, and checkpoints to
// know how to merge the slices (split_dim).
class SplitLayer {
 public:
  virtual ~SplitLayer() = default;
  // The parameters of this layer that hold a slice (a replicated bias is not among them).
  virtual std::vector<at::Tensor> split_parameters() const = 0;
  // How `param` (one of split_parameters()) is cut.
  virtual SplitDim split_dim(const at::Tensor& param) const = 0;
  virtual const comm::CommunicatorPtr& group() const = 0;
};
// Every split parameter of `module`'s tree (its SplitLayer submodules').
std::vector<at::Tensor> split_parameters(const torch::nn::Module& module);
// The same by name (as module.named_parameters() calls them; a parameter registered under two
// names is listed under both), with how each is cut.
std::vector<std::pair<std::string, SplitDim>> split_parameter_dims(const torch::nn::Module& module);

struct ColumnParallelLinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;  // of the unsplit layer; the group's size must divide it
  bool bias = true;
  bool gather_output = false;  // all-gather Y (else each rank keeps Y_r)
  // The output is `fused_parts` blocks stacked (a fused q/k/v projection: 3); each block is split
  // on its own, so rank r holds rows r of q, of k and of v, in that order.
  int fused_parts = 1;
};

class ColumnParallelLinearImpl : public torch::nn::Module, public SplitLayer {
 public:
  ColumnParallelLinearImpl(const ColumnParallelLinearOptions& options, comm::CommunicatorPtr group);
  at::Tensor forward(const at::Tensor& x);
  // The rank's slice of an unsplit weight [out, in] (and bias [out]) copied in.
  void set_from_full(const at::Tensor& weight, const at::Tensor& bias = {});
  // The unsplit weight's rows of this rank (fused parts included), for slicing any [out, ...].
  at::Tensor slice_rows(const at::Tensor& full) const;
  std::vector<at::Tensor> split_parameters() const override;
  SplitDim split_dim(const at::Tensor&) const override { return {0, options_.fused_parts}; }
  const comm::CommunicatorPtr& group() const override { return group_; }
  const ColumnParallelLinearOptions& options() const { return options_; }

  at::Tensor weight;  // [out / N, in]
  at::Tensor bias;    // [out / N], undefined without bias

 private:
  ColumnParallelLinearOptions options_;
  comm::CommunicatorPtr group_;
};
TORCH_MODULE(ColumnParallelLinear);

struct RowParallelLinearOptions {
  int64_t in_features = 0;  // of the unsplit layer; the group's size must divide it
  int64_t out_features = 0;
  bool bias = true;
  // The input is already split along its last dimension (a column layer's output); otherwise
  // the whole input is given and this rank's slice taken (backward: all-gather).
  bool input_is_parallel = true;
};

class RowParallelLinearImpl : public torch::nn::Module, public SplitLayer {
 public:
  RowParallelLinearImpl(const RowParallelLinearOptions& options, comm::CommunicatorPtr group);
  at::Tensor forward(const at::Tensor& x);
  void set_from_full(const at::Tensor& weight, const at::Tensor& bias = {});
  at::Tensor slice_columns(const at::Tensor& full) const;  // [out, in] -> [out, in / N]
  std::vector<at::Tensor> split_parameters() const override { return {weight}; }
  SplitDim split_dim(const at::Tensor&) const override { return {1, 1}; }  // input columns
  const comm::CommunicatorPtr& group() const override { return group_; }
  const RowParallelLinearOptions& options() const { return options_; }

  at::Tensor weight;  // [out, in / N]
  at::Tensor bias;    // [out], replicated (added once, after the all-reduce)

 private:
  RowParallelLinearOptions options_;
  comm::CommunicatorPtr group_;
};
TORCH_MODULE(RowParallelLinear);

class VocabParallelEmbeddingImpl : public torch::nn::Module, public SplitLayer {
 public:
  VocabParallelEmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim,
                             comm::CommunicatorPtr group);
  at::Tensor forward(const at::Tensor& ids);  // ids: any shape of int64 in [0, V)
  void set_from_full(const at::Tensor& weight);
  Range vocab_range() const { return range_; }
  std::vector<at::Tensor> split_parameters() const override { return {weight}; }
  SplitDim split_dim(const at::Tensor&) const override { return {0, 1}; }
  const comm::CommunicatorPtr& group() const override { return group_; }

  at::Tensor weight;  // [V / N, C]

 private:
  Range range_;
  comm::CommunicatorPtr group_;
};
TORCH_MODULE(VocabParallelEmbedding);

// Per-token cross-entropy of logits split by vocabulary: `logits` [tokens, V / N] holds columns
// vocab_range of the whole [tokens, V]; `targets` [tokens] are whole-vocabulary ids. Returns the
// [tokens] losses (the same on every rank of the group), differentiable in `logits`. Computed in
// fp32 whatever the logits' dtype. COLLECTIVE over the group (two all-reduces forward, none
// backward). A token whose target is `ignore_index` has loss 0 and gradient 0 (F::cross_entropy
// with reduction none; a caller's mean over the kept tokens is F::cross_entropy's mean). Throws
// Error naming the value for any other target outside [0, V), on every rank of the group.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                                        const comm::CommunicatorPtr& group,
                                        int64_t ignore_index = -100);

}  // namespace tp
}  // namespace deepspeed
