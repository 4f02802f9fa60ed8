// Megatron's four communication mappings as autograd functions. Each pairs a forward collective
// with its adjoint in backward:
//   copy    identity        | all-reduce     (every rank's use of x contributed to dL/dx)
//   reduce  all-reduce      | identity       (the sum's gradient reaches each summand unchanged)
//   gather  all-gather      | keep own slice
//   scatter keep own slice  | all-gather
// The group rides in the autograd context as a capsule, so the communicator stays alive for as
// long as the graph that needs it.
#include "tp/mappings.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include "deepspeed/tp.h"

namespace deepspeed {
namespace tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(comm::CommunicatorPtr g) : group(std::move(g)) {}
  comm::CommunicatorPtr group;
};

void keep_group(AutogradContext* ctx, const comm::CommunicatorPtr& group) {
  ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(group));
}
const comm::CommunicatorPtr& group_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<GroupCapsule>(ctx->saved_data["group"].toCapsule())
      ->group;
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const comm::CommunicatorPtr& group) {
    keep_group(ctx, group);
    return x.view_as(x);  // a new tensor for autograd; the data is shared
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {all_reduce_sum(g[0], *group_of(ctx)), at::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x,
                            const comm::CommunicatorPtr& group) {
    return all_reduce_sum(x, *group);
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], at::Tensor()}; }
};

struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const comm::CommunicatorPtr& group) {
    keep_group(ctx, group);
    return all_gather_last_dim(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {own_slice_last_dim(g[0], *group_of(ctx)), at::Tensor()};
  }
};

struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const comm::CommunicatorPtr& group) {
    keep_group(ctx, group);
    return own_slice_last_dim(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {all_gather_last_dim(g[0], *group_of(ctx)), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_reduce_sum(const at::Tensor& x, comm::Communicator& group) {
  at::Tensor out = x.contiguous().clone();
  if (group.world_size() > 1) group.all_reduce(out)->wait();
  return out;
}

at::Tensor all_gather_last_dim(const at::Tensor& x, comm::Communicator& group) {
  const int n = group.world_size();
  if (n == 1) return x;
  at::Tensor in = x.contiguous();
  // [N, ...x] with rank r's x in slice r, then moved to the last dimension: [..., N * last].
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), in.sizes().begin(), in.sizes().end());
  at::Tensor out = at::empty(shape, in.options());
  group.all_gather(out, in)->wait();
  return out.movedim(0, -2).reshape([&] {
    auto s = in.sizes().vec();
    s.back() *= n;
    return s;
  }());
}

at::Tensor own_slice_last_dim(const at::Tensor& x, comm::Communicator& group) {
  const int n = group.world_size();
  if (n == 1) return x;
  const Range r = split_range(x.size(-1), n, group.rank(), "the last dimension");
  return x.narrow(-1, r.begin, r.size()).contiguous();
}

at::Tensor copy_to_region(const at::Tensor& x, const comm::CommunicatorPtr& group) {
  if (group->world_size() == 1) return x;
  return CopyToRegion::apply(x, group);
}
at::Tensor reduce_from_region(const at::Tensor& x, const comm::CommunicatorPtr& group) {
  if (group->world_size() == 1) return x;
  return ReduceFromRegion::apply(x, group);
}
at::Tensor gather_from_region(const at::Tensor& x, const comm::CommunicatorPtr& group) {
  if (group->world_size() == 1) return x;
  return GatherFromRegion::apply(x, group);
}
at::Tensor scatter_to_region(const at::Tensor& x, const comm::CommunicatorPtr& group) {
  if (group->world_size() == 1) return x;
  return ScatterToRegion::apply(x, group);
}

Range split_range(int64_t size, int parts, int rank, const char* what) {
  if (parts < 1 || size % parts != 0)
    throw ConfigError(std::string("tensor parallelism: ") + what + " (" + std::to_string(size) +
                      ") is not divisible by the tensor-parallel size " + std::to_string(parts));
  const int64_t per = size / parts;
  return {rank * per, (rank + 1) * per};
}

}  // namespace tp
}  // namespace deepspeed
