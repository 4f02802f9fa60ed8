#include "zero/view_moments.h"

#include <torch/torch.h>

#include "zero/moment_state.h"

namespace deepspeed {
namespace zero {

ViewMoments::ViewMoments(torch::optim::Optimizer& optimizer, at::Tensor master,
                         std::vector<at::Tensor> views)
    : optimizer_(optimizer), master_(std::move(master)), views_(std::move(views)) {
  const auto family = moment_family(&optimizer_);
  TORCH_CHECK(keeps_one_moment(family), "ViewMoments: not a one-moment optimizer (internal error)");
  sgd_ = family == MomentFamily::kSgd;
  for (const auto& v : views_)
    TORCH_CHECK(v.dim() == 1 && v.is_contiguous() && v.storage().is_alias_of(master_.storage()),
                "ViewMoments: a group's tensor is not a 1-D view of the master (internal error)");
  if (!sgd_) adopt(/*create=*/true);
}

void ViewMoments::adopt(bool create) {
  create = create || !sgd_;
  for (const auto& v : views_) {
    // The view's state, made by the optimizer's rule if it has none (a view-sized transient).
    const at::Tensor own = moments_of(optimizer_, v, create)[0];
    if (!own.defined()) {  // SGD: no buffer yet, or none kept (no momentum)
      TORCH_CHECK(sgd_, "ViewMoments: no state for a group's view (internal error)");
      continue;
    }
    if (!moment_.defined()) moment_ = at::zeros_like(master_, at::MemoryFormat::Contiguous);
    if (own.storage().is_alias_of(moment_.storage())) continue;
    at::Tensor slice = moment_.narrow(0, v.storage_offset() - master_.storage_offset(), v.numel());
    slice.copy_(own.view({-1}));
    set_moment(optimizer_, v, slice);
  }
}

at::Tensor ViewMoments::moment(bool create) {
  adopt(create);
  return moment_;
}

void ViewMoments::after_step() {
  if (sgd_) adopt(/*create=*/false);  // the others update their slices in place
}

int64_t ViewMoments::step() const {
  int64_t step = 0;
  for (const auto& v : views_) step = std::max(step, moment_step(optimizer_, v));
  return step;
}

void ViewMoments::set_step(int64_t step) {
  if (step < 0) return;
  for (const auto& v : views_) set_moment_step(optimizer_, v, step);
  if (!sgd_) return;
  // No buffer left (step 0, or only groups without momentum here): the tensor goes too, until
  // a step makes buffers again.
  bool kept = false;
  for (const auto& v : views_) kept = kept || moments_of(optimizer_, v, /*create=*/false)[0].defined();
  if (!kept) moment_ = at::Tensor();
}

}  // namespace zero
}  // namespace deepspeed
