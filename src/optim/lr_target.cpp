// LRTarget defaults and the adapter that lets a scheduler drive a libtorch optimizer.
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "deepspeed/errors.h"
#include "deepspeed/lr_scheduler.h"
#include "optim/lion.h"

namespace deepspeed {

std::pair<double, double> LRTarget::betas(size_t) const {
  throw Error("LRTarget::betas: this optimizer has no betas");
}
void LRTarget::set_betas(size_t, std::pair<double, double>) {
  throw Error("LRTarget::set_betas: this optimizer has no betas");
}
double LRTarget::momentum(size_t) const {
  throw Error("LRTarget::momentum: this optimizer has no momentum");
}
void LRTarget::set_momentum(size_t, double) {
  throw Error("LRTarget::set_momentum: this optimizer has no momentum");
}

namespace {

using torch::optim::OptimizerOptions;

// The betas of Adam, AdamW and Lion live in unrelated option types; this reaches each.
std::tuple<double, double>* betas_of(OptimizerOptions& o) {
  if (auto* a = dynamic_cast<torch::optim::AdamOptions*>(&o)) return &a->betas();
  if (auto* a = dynamic_cast<torch::optim::AdamWOptions*>(&o)) return &a->betas();
  if (auto* a = dynamic_cast<optim::LionOptions*>(&o)) return &a->betas();
  return nullptr;
}

class TorchLRTarget : public LRTarget {
 public:
  TorchLRTarget(torch::optim::Optimizer& opt, std::shared_ptr<torch::optim::Optimizer> keep)
      : opt_(opt), keep_(std::move(keep)) {}

  size_t num_groups() const override { return opt_.param_groups().size(); }
  double lr(size_t g) const override { return options(g).get_lr(); }
  void set_lr(size_t g, double lr) override { options(g).set_lr(lr); }

  bool has_betas() const override { return num_groups() > 0 && betas_of(options(0)); }
  std::pair<double, double> betas(size_t g) const override {
    auto* b = betas_of(options(g));
    if (!b) return LRTarget::betas(g);
    return {std::get<0>(*b), std::get<1>(*b)};
  }
  void set_betas(size_t g, std::pair<double, double> betas) override {
    auto* b = betas_of(options(g));
    if (!b) return LRTarget::set_betas(g, betas);
    *b = std::make_tuple(betas.first, betas.second);
  }

  bool has_momentum() const override { return num_groups() > 0 && sgd(0); }
  double momentum(size_t g) const override {
    auto* s = sgd(g);
    return s ? s->momentum() : LRTarget::momentum(g);
  }
  void set_momentum(size_t g, double m) override {
    auto* s = sgd(g);
    if (!s) return LRTarget::set_momentum(g, m);
    s->momentum(m);
  }

 private:
  OptimizerOptions& options(size_t g) const { return opt_.param_groups().at(g).options(); }
  torch::optim::SGDOptions* sgd(size_t g) const {
    return dynamic_cast<torch::optim::SGDOptions*>(&options(g));
  }

  torch::optim::Optimizer& opt_;
  std::shared_ptr<torch::optim::Optimizer> keep_;
};

}  // namespace

std::shared_ptr<LRTarget> lr_target_for(std::shared_ptr<torch::optim::Optimizer> optimizer) {
  if (!optimizer) throw Error("lr_target_for: null optimizer");
  auto& ref = *optimizer;
  return std::make_shared<TorchLRTarget>(ref, std::move(optimizer));
}

std::shared_ptr<LRTarget> lr_target_for(torch::optim::Optimizer& optimizer) {
  return std::make_shared<TorchLRTarget>(optimizer, nullptr);
}

}  // namespace deepspeed
