// The seam between checkpoints and optimizer state that is not Adam's per-element moments.
//
// Checkpoints save every optimizer's step, exp_avg and exp_avg_sq as fragments that reshard
// (checkpoint/layout.h). The 1-bit family holds more: error-feedback buffers (each rank its own),
// 0/1 Adam's local updates between synchronisations (each rank its own parameters and momentum),
// 1-bit Lamb's fresh variance and frozen trust ratios (equal on every rank). An optimizer that
// implements this interface has that state written into each rank's optimizer-state file, under
// `optimizer_extra.<kind>/<name>`, and handed back after a load, so a resumed run continues bit
// for bit (DeepSpeed resets the error feedback on load instead; docs/config.md says so).
//
//   replicated: equal on every rank; any saved rank's copy serves, whatever the world size.
//   per_rank:   this rank's own; handed back only when the checkpoint was saved at the same world
//               size (and pipeline), each rank getting its own rank's file. Otherwise it is empty
//               and the optimizer restarts that state, as DeepSpeed does for all of it.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

namespace deepspeed {
namespace optim {

struct ExtraState {
  std::map<std::string, at::Tensor> replicated;
  std::map<std::string, at::Tensor> per_rank;
  bool empty() const { return replicated.empty() && per_rank.empty(); }
};

class ExtraOptimizerState {
 public:
  virtual ~ExtraOptimizerState() = default;
  // Names the optimizer whose state this is: a checkpoint's extra state is handed back only to
  // an optimizer of the same kind (a 1-bit Adam checkpoint loaded into 0/1 Adam gets none).
  virtual std::string extra_state_kind() const = 0;
  // CPU tensors to save (contiguous; copies or views that stay valid until the save returns).
  virtual ExtraState extra_state() const = 0;
  // Called after a load has set the Adam state (step, moments) and the parameters, with what the
  // checkpoint held for this rank (see above; possibly nothing). A tensor of the wrong shape is an
  // error naming it. Local (no collective).
  virtual void load_extra_state(const ExtraState& saved) = 0;
  // Bytes this optimizer holds beyond its per-parameter torch state (step, exp_avg, exp_avg_sq),
  // as they are in memory now (not as saved): error-feedback buffers, fresh variance, local
  // updates, per-tensor scalars. The memory report counts them in optimizer_states
  // (zero/optimizer_state_bytes.cpp). Local.
  virtual int64_t extra_state_bytes() const = 0;
};

// Per-parameter tensors saved as one flat tensor, and back. copy_from_flat throws c10::Error
// naming `what` when the element counts differ (a checkpoint of another model).
at::Tensor concat_flat(const std::vector<at::Tensor>& tensors);
void copy_from_flat(const at::Tensor& flat, const std::vector<at::Tensor>& dst,
                    const std::string& what);
// Bytes of the tensors' storages (undefined ones: 0), for extra_state_bytes().
int64_t storage_bytes_of(const std::vector<at::Tensor>& tensors);

}  // namespace optim
}  // namespace deepspeed
