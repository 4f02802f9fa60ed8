// ZeRO stage 3's unit of gathering, made explicit (libtorch modules have no forward hooks).
//
// A *unit* is a module whose parameters are gathered together just before it runs and released
// right after. A model marks its units by wrapping them, as FSDP's wrap:
//     blocks_.push_back(register_module("block0", std::make_shared<deepspeed::ZeroUnit<Block>>(Block(c))));
//     x = blocks_[0]->forward(x);
// or by putting them in a LayerList (each layer is a unit). Parameters outside every unit form
// the *root unit*, which stays gathered. Without a stage-3 engine a unit is a plain pass-through.
//
// ZeroUnit adopts the inner module's parameters, buffers and children under their own names, so
// "block0.attn.qkv.weight" keeps its name when Block is wrapped.
//
// Inside a unit, prefer deepspeed::zero::linear over torch::nn::Linear's forward: autograd's
// linear saves a transposed *view* of the weight for backward, which keeps the gathered storage
// alive until backward (correct, but nothing is freed); zero::linear saves the weight itself, so
// releasing it really frees the memory (DeepSpeed's LinearFunctionForZeroStage3 for the same reason).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace deepspeed {
namespace zero {

// What a stage-3 engine does around a unit. Called on the thread running forward / backward.
class UnitHooks {
 public:
  virtual void pre_forward(int unit) = 0;   // gather (and prefetch what follows in the trace)
  virtual void post_forward(int unit) = 0;  // release (unless kept by the reuse distance)
  virtual void pre_backward(int unit) = 0;  // gather again for the unit's backward

 protected:
  ~UnitHooks() = default;
};

// y = x W^T + b, saving W itself (not a view of it) for backward. x: [..., in], W: [out, in].
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

// Parameters partitioned at construction by zero::Init, waiting for initialize() to adopt them.
struct InitShard {
  at::Tensor slice;                          // this rank's slice of the unit's padded flat buffer
  std::vector<at::Tensor> params;            // the partitioned parameters (now numel 0), in order
  std::vector<std::vector<int64_t>> shapes;  // their shapes
  int64_t padded_numel = 0;
  int world_size = 0;
};

}  // namespace zero

// The non-template part of ZeroUnit: what the engine finds by walking the module tree.
class ZeroUnitBase : public torch::nn::Module {
 public:
  // The engine attaches itself at initialize() (stage 3 only) and detaches when destroyed.
  void attach(zero::UnitHooks* hooks, int id) { hooks_ = hooks, id_ = id; }
  zero::UnitHooks* hooks() const { return hooks_; }
  int unit_id() const { return id_; }
  std::shared_ptr<torch::nn::Module> inner_module() const { return inner_; }
  void train(bool on = true) override;
  // zero::Init: set while the unit's parameters exist only as this rank's slice.
  zero::InitShard& init_shard() { return shard_; }

 protected:
  // Registers inner's own parameters, buffers and children on this module under their names, then
  // partitions them if a zero::Init scope is active on this thread.
  void adopt(std::shared_ptr<torch::nn::Module> inner);
  // Identity on the unit's output whose backward gathers the unit again (pre_backward).
  at::Tensor attach_output(const at::Tensor& out) const;

  template <class T>
  T attach_outputs(T out) const {
    if constexpr (std::is_same_v<T, at::Tensor>) {
      return attach_output(out);
    } else if constexpr (std::is_same_v<T, std::vector<at::Tensor>>) {
      for (auto& t : out) t = attach_output(t);
      return out;
    } else {
      return out;  // other output types pass through (no pre-backward gather: see zero3.md)
    }
  }

  // pre_forward on construction, post_forward on destruction (also when forward throws).
  class ForwardScope {
   public:
    explicit ForwardScope(const ZeroUnitBase& u) : u_(u) { u_.hooks_->pre_forward(u_.id_); }
    ~ForwardScope() { u_.hooks_->post_forward(u_.id_); }

   private:
    const ZeroUnitBase& u_;
  };

 private:
  zero::UnitHooks* hooks_ = nullptr;
  int id_ = -1;
  std::shared_ptr<torch::nn::Module> inner_;
  zero::InitShard shard_;
};

namespace detail {
template <class T>
std::shared_ptr<torch::nn::Module> module_ptr(const torch::nn::ModuleHolder<T>& m) {
  return m.ptr();
}
template <class T>
std::shared_ptr<torch::nn::Module> module_ptr(const std::shared_ptr<T>& m) {
  return m;
}
}  // namespace detail

// M: a module holder (e.g. gpt::Block from TORCH_MODULE) or a std::shared_ptr to a module.
template <class M>
class ZeroUnit : public ZeroUnitBase {
 public:
  explicit ZeroUnit(M inner) : inner_(std::move(inner)) { adopt(detail::module_ptr(inner_)); }

  template <class... Args>
  auto forward(Args&&... args) {
    if (!hooks()) return inner_->forward(std::forward<Args>(args)...);
    decltype(inner_->forward(std::forward<Args>(args)...)) out;
    {
      ForwardScope scope(*this);
      out = inner_->forward(std::forward<Args>(args)...);
    }
    return attach_outputs(std::move(out));
  }
  M& inner() { return inner_; }

 private:
  M inner_;
};

// A sequence of units applied one after another to a tensor (each layer maps [.., C] -> [.., C]).
// Layers are registered as "0", "1", ... like torch::nn::Sequential.
class LayerListImpl : public torch::nn::Module {
 public:
  template <class M>
  void push_back(M layer) {
    auto unit = std::make_shared<ZeroUnit<M>>(std::move(layer));
    register_module(std::to_string(calls_.size()), unit);
    calls_.push_back([unit](const at::Tensor& x) { return unit->forward(x); });
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& f : calls_) x = f(x);
    return x;
  }
  size_t size() const { return calls_.size(); }

 private:
  std::vector<std::function<at::Tensor(const at::Tensor&)>> calls_;
};
TORCH_MODULE(LayerList);

}  // namespace deepspeed
