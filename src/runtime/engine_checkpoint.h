// Engine checkpoints: save and load of the whole engine state through a FileSystem (so tests can
// inject faults). Engine::save_checkpoint / load_checkpoint call these on posix_file_system().
// Layout and fragment format: checkpoint/layout.h; guarantees: docs/checkpoints.md.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/file_system.h"
#include "runtime/engine_state.h"

namespace deepspeed {
namespace checkpoint {

struct SaveOptions {
  std::string tag;  // "" = "global_step<global_steps>"
  nlohmann::json client_state = nlohmann::json::object();
  bool save_latest = true;
};

struct LoadOptions {
  std::string tag;  // "" = the content of <dir>/latest
  bool load_module_strict = true;
  bool load_optimizer_states = true;
  bool load_lr_scheduler_states = true;
  bool load_module_only = false;
};

// Returns the tag folder written. COLLECTIVE.
std::string save_engine_checkpoint(EngineState& state, FileSystem& fs, const std::string& save_dir,
                                   const SaveOptions& options);
// COLLECTIVE.
LoadedCheckpoint load_engine_checkpoint(EngineState& state, FileSystem& fs,
                                        const std::string& load_dir, const LoadOptions& options);

// Stage 3: the full parameters are present (gathered) on every rank while this object lives, so
// the module file is written from and loaded into whole tensors (as DeepSpeed's
// stage3_gather_16bit_weights_on_model_save); release() re-partitions, keeping modifier_rank's
// values. Stages 0-2: nothing happens. Construction and release are COLLECTIVE.
class FullParametersScope {
 public:
  FullParametersScope(EngineState& s, std::optional<int> modifier_rank)
      : release_(s.stage->gather_for_access({}, modifier_rank)) {}
  ~FullParametersScope() {
    try {
      release();
    } catch (...) {  // already unwinding from an agreed error; every rank is here
    }
  }
  void release() {
    auto r = std::move(release_);
    release_ = nullptr;
    if (r) r();
  }
  FullParametersScope(const FullParametersScope&) = delete;
  FullParametersScope& operator=(const FullParametersScope&) = delete;

 private:
  std::function<void()> release_;
};

// Shared by save and load.
std::string precision_name(const Config& config);
// Trainable parameter names in registration order (the order of EngineState::trainable).
std::vector<std::string> trainable_names(torch::nn::Module& module);
// Runs `body` on every rank, then agrees: if any rank threw a deepspeed::Error, c10::Error or JSON
// error, every rank throws CheckpointError (the failing rank its own message) so no rank is left
// waiting in a later collective. `what` names the phase. COLLECTIVE.
void run_agreed(comm::Communicator& comm, const std::string& what, const std::function<void()>& body);

}  // namespace checkpoint
}  // namespace deepspeed
