// Each part of the model waits, just before it runs, only for its own parameters of an update the
// last step left running (zero/pending_update.h). Two such updates:
//   - offload_optimizer.overlap_forward at ZeRO stages 1 and 2 (one data-parallel rank): the CPU
//     Adam's last ranges run on into the next forward (coordinates: the shard's partition);
//   - zero_optimization.overlap_param_gather at stages 1 and 2 with peers: the all-gather of the
//     updated partitions runs on into the next forward (coordinates: the whole flat buffer;
//     zero/param_gather.h).
//
// ZeRO-Offload's update during backward (zero/step_during_backward.h) starts on each range as its
// gradients are final, but a CPU Adam over a big model takes longer than backward: without this,
// engine.step() waits for the rest, and the next forward starts only after all of it. With it,
// step() hands the update over (StepDuringBackward::hand_over): the ranges still queued run in the
// order the next forward reads them (first_read(): the root's first, as the forward reads the
// root when it begins, then unit by unit in the model's order). For either update,
//   - Engine::forward, before the model runs, waits for the parameters outside every ZeroUnit
//     (the embeddings, the final norm: the root, as at stage 3);
//   - each ZeroUnit, before it runs, waits for its own parameters (all of them, nested units'
//     too), here through the same hooks stage 3 gathers with (zero/stage3/unit_internals.h);
//   - on a GPU "waits" is the compute stream's: the host only waits until the range's upload (or
//     the chunk's all-gather) is queued, then the stream waits for it (an event).
// A model without ZeroUnits waits for the whole update when its forward begins (still after the
// data loading and whatever the program did since step()). Every other reader of the parameters
// or the optimizer state (the next backward, save/load_checkpoint, gathered_parameters,
// consolidated_state_dict, the shard's own state accessors) completes the update first, and so
// does engine.complete_step(), for a program that reads the module's parameters itself.
#pragma once
#include <cstdint>
#include <vector>

#include <torch/nn/module.h>

#include "util/ranges.h"
#include "zero/flat_params.h"
#include "zero/pending_update.h"
#include "zero/stage3/unit_internals.h"

namespace deepspeed {
namespace zero {

class ForwardWaits final : public UnitHooks {
 public:
  // Attaches itself to the ZeroUnits of `model` (refused if another engine already has them,
  // naming `config_key`). `update` counts elements from `window_begin` of the flat buffer (the
  // shard's partition: where it begins; the gather: 0) over `window_numel`.
  ForwardWaits(torch::nn::Module& model, const FlatParams& flat, int64_t window_begin,
               int64_t window_numel, PendingUpdate& update, const char* config_key);
  ~ForwardWaits();  // detaches the units
  ForwardWaits(const ForwardWaits&) = delete;
  ForwardWaits& operator=(const ForwardWaits&) = delete;

  // Engine::forward is about to run the model: the root's parameters (all of them without units).
  void before_forward();
  void pre_forward(int unit) override;
  void post_forward(int) override {}
  void pre_backward(int) override {}
  bool needs_pre_backward() const override { return false; }  // outputs stay as they are
  const UnitSlots& unit_slots(int unit) const override { return units_.at(unit); }
  // When the next forward first waits for elements [begin, end) of the window: 0 for the root
  // (before_forward), 1 + u for unit u (units in module-tree order, a model's forward order),
  // INT64_MAX for elements no parameter holds (padding).
  int64_t first_read(int64_t begin, int64_t end) const;
  size_t unit_count() const { return units_.size(); }

 private:
  PendingUpdate& update_;
  std::vector<UnitSlots> units_;                      // module, params and shapes only
  std::vector<std::vector<ElementRange>> ranges_;     // each unit's, in the window, merged
  std::vector<ElementRange> root_;
  bool units_found_ = false;
};

}  // namespace zero
}  // namespace deepspeed
