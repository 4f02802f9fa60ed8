// zero::Init: build a model already partitioned, so that a model bigger than one rank's memory
// can be constructed at all (DeepSpeed's `with deepspeed.zero.Init():`).
//
//     std::shared_ptr<GPTImpl> model;
//     {
//       deepspeed::zero::Init init(comm);     // COLLECTIVE scope: every rank builds the same model
//       model = std::make_shared<GPTImpl>(cfg);
//     }
//     auto [engine, ...] = deepspeed::initialize<GPTImpl>({.model = model, ...});  // stage 3
//
// While an Init is alive on a thread, every ZeroUnit constructed on that thread, right after its
// inner module is built, broadcasts its parameters from rank 0 (so all ranks agree whatever their
// RNG did), keeps only this rank's slice of its flat buffer and releases the full parameters
// (numel 0). The peak is therefore one unit, not the model. Parameters outside every unit stay
// whole (the root unit). initialize() with zero_optimization.stage 3 adopts the slices.
// `dtype` (DeepSpeed's zero.Init(dtype=...)): the slices are kept in this type, e.g. bf16 when the
// config enables bf16 (initialize() casts the model to it anyway); that halves what a model built
// under Init holds until initialize(). Default: the parameters' own dtype.
// Thread-safety: the scope is per thread (tests run ranks as threads); scopes may nest.
#pragma once
#include <optional>

#include <c10/core/ScalarType.h>

#include "deepspeed/comm.h"

namespace deepspeed {
class ZeroUnitBase;
namespace zero {

class Init {
 public:
  // comm: the data-parallel group the engine will use (default: the world from
  // init_distributed(), which is called here when the launcher's environment says this process
  // is one of several, as initialize() does; else a single process). enabled = false makes the
  // scope a no-op.
  explicit Init(comm::CommunicatorPtr comm = nullptr, bool enabled = true,
                std::optional<at::ScalarType> dtype = std::nullopt);
  ~Init();
  Init(const Init&) = delete;
  Init& operator=(const Init&) = delete;

  // The innermost enabled scope on this thread, or nullptr.
  static Init* current();

 private:
  friend class deepspeed::ZeroUnitBase;
  // Called by ZeroUnitBase after adopting its inner module. COLLECTIVE.
  void partition(ZeroUnitBase& unit);

  comm::CommunicatorPtr comm_;
  Init* previous_ = nullptr;
  bool enabled_;
  std::optional<at::ScalarType> dtype_;
};

}  // namespace zero
}  // namespace deepspeed
