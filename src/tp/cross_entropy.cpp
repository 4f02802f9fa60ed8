// Cross-entropy over logits split by vocabulary (Megatron's vocab_parallel_cross_entropy).
// Rank r holds columns [r V/N, (r+1) V/N) of the [tokens, V] logits z. Per token t:
//   m   = max_v z[t, v]                      all-reduce (max) of the local maxima
//   S   = sum_v exp(z[t, v] - m)             all-reduce (sum) of local sums  } one all-reduce of
//   z_y = z[t, y_t] - m                      held by one rank, zeros elsewhere } both, stacked
//   loss_t = log S - z_y
// Backward: d loss_t / d z[t, v] = softmax[t, v] - [v == y_t], each rank for its own columns, so
// no collective runs in backward.
// A token whose target is ignore_index (-100: padding) has loss 0 and gradient 0, as
// F::cross_entropy with reduction none gives it; any other target outside [0, V) is an error
// (it would otherwise count as "held by no rank": loss log S, gradient the full softmax).
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include "deepspeed/tp.h"

namespace deepspeed {
namespace tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, const comm::CommunicatorPtr& group,
                            int64_t ignore_index) {
    comm::Communicator& g = *group;
    at::Tensor z = logits.to(at::kFloat);
    const int64_t per_rank = z.size(-1), begin = per_rank * g.rank();
    at::Tensor m = std::get<0>(z.max(-1)).contiguous();
    if (g.world_size() > 1) g.all_reduce(m, comm::ReduceOp::Max)->wait();
    z = z - m.unsqueeze(-1);

    // An ignored token is "outside" on every rank (z_y = 0); its loss and gradient are zeroed.
    const at::Tensor ignored = targets == ignore_index;
    const at::Tensor outside = (targets < begin) | (targets >= begin + per_rank) | ignored;
    const at::Tensor local = (targets - begin).masked_fill(outside, 0);
    at::Tensor zy = z.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0);
    at::Tensor e = z.exp();
    at::Tensor sums = torch::stack({e.sum(-1), zy});  // [2, tokens]
    if (g.world_size() > 1) g.all_reduce(sums)->wait();
    at::Tensor loss = (sums[0].log() - sums[1]).masked_fill_(ignored, 0.0);

    ctx->save_for_backward({e.div_(sums[0].unsqueeze(-1)), local, outside, ignored});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto saved = ctx->get_saved_variables();
    at::Tensor d = saved[0].clone();  // softmax of this rank's columns
    const at::Tensor hit = saved[2].logical_not().to(d.scalar_type()).unsqueeze(-1);
    d.scatter_add_(-1, saved[1].unsqueeze(-1), -hit);
    d.masked_fill_(saved[3].unsqueeze(-1), 0.0);
    d.mul_(grad[0].unsqueeze(-1));
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {d.to(dtype), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                                        const comm::CommunicatorPtr& group, int64_t ignore_index) {
  if (logits.dim() != 2 || targets.dim() != 1 || logits.size(0) != targets.size(0))
    throw Error(
        "vocab_parallel_cross_entropy: logits must be [tokens, V / N] and targets "
        "[tokens]; got " +
        c10::str(logits.sizes()) + " and " + c10::str(targets.sizes()));
  // Checked before the first collective, so every rank of the group (same targets) throws alike.
  // (On a GPU, reading the flag waits for the targets: one small synchronisation per loss, as
  // F::cross_entropy's own check costs on the CPU.)
  const int64_t vocab = logits.size(-1) * group->world_size();
  const at::Tensor bad = ((targets < 0) | (targets >= vocab)) & (targets != ignore_index);
  if (bad.any().item<bool>())
    throw Error("vocab_parallel_cross_entropy: target " +
                std::to_string(targets.masked_select(bad)[0].item<int64_t>()) +
                " is outside the vocabulary [0, " + std::to_string(vocab) +
                ") and is not ignore_index (" + std::to_string(ignore_index) + ")");
  return VocabParallelCrossEntropy::apply(logits, targets, group, ignore_index);
}

}  // namespace tp
}  // namespace deepspeed
