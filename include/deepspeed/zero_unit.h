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
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace deepspeed {
namespace zero {

// y = x W^T + b, saving W itself (not a view of it) for backward. x: [..., in], W: [out, in].
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

// What a stage-3 engine does around a unit, and zero::Init's slice of it: both private
// (src/zero/stage3/unit_internals.h). Programs compile against this header, so the engine's
// internals stay out of it and can change without breaking them.
class UnitHooks;
struct InitShard;

}  // namespace zero

namespace detail {
struct ZeroUnitAccess;  // the library's way to a unit's hooks and shard (src/zero/stage3)
}  // namespace detail

// The non-template part of ZeroUnit: what the engine finds by walking the module tree.
class ZeroUnitBase : public torch::nn::Module {
 public:
  std::shared_ptr<torch::nn::Module> inner_module() const { return inner_; }
  void train(bool on = true) override;

 protected:
  // Registers inner's own parameters, buffers and children on this module under their names, then
  // partitions them if a zero::Init scope is active on this thread.
  void adopt(std::shared_ptr<torch::nn::Module> inner);
  // Whether a stage-3 engine is attached (set at initialize(), cleared when it is destroyed).
  bool attached() const { return hooks_ != nullptr; }
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

  // The engine's pre_forward (gather) on construction, post_forward (release) on destruction
  // (also when forward throws).
  class ForwardScope {
   public:
    explicit ForwardScope(const ZeroUnitBase& u) : u_(u) { u_.pre_forward(); }
    ~ForwardScope() { u_.post_forward(); }

   private:
    const ZeroUnitBase& u_;
  };

 private:
  friend struct detail::ZeroUnitAccess;
  void pre_forward() const;
  void post_forward() const;

  zero::UnitHooks* hooks_ = nullptr;
  int id_ = -1;
  std::shared_ptr<torch::nn::Module> inner_;
  std::shared_ptr<zero::InitShard> shard_;  // set while zero::Init holds only this rank's slice
  // Set when the stage-3 engine that partitioned this unit is destroyed: its released parameters
  // (numel 0) cannot be rebuilt by another engine, which refuses them naming one.
  bool partitioned_by_ended_engine_ = false;
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
    if (!attached()) return inner_->forward(std::forward<Args>(args)...);
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

// Elements in the module's parameters (frozen ones included), each parameter counted once (tied
// weights too), at its full size also where ZeRO-3 keeps only a partition: under zero::Init and
// after initialize() at stage 3, where a unit's released parameters hold no elements. Local.
int64_t count_parameters(const torch::nn::Module& module);

}  // namespace deepspeed
