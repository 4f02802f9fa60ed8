#include "runtime/engine_checkpoint.h"

#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "deepspeed/topology.h"

namespace deepspeed {

bool Engine::save_checkpoint(const std::string& save_dir, const std::string& tag,
                             const nlohmann::json& client_state, bool save_latest) {
  checkpoint::SaveOptions o;
  o.tag = tag;
  o.client_state = client_state.is_null() ? nlohmann::json::object() : client_state;
  o.save_latest = save_latest;
  in_call("save_checkpoint", [&] {
    checkpoint::save_engine_checkpoint(*state_, checkpoint::posix_file_system(), save_dir, o);
  });
  return true;
}

LoadedCheckpoint Engine::load_checkpoint(const std::string& load_dir, const std::string& tag,
                                         bool load_module_strict, bool load_optimizer_states,
                                         bool load_lr_scheduler_states, bool load_module_only) {
  checkpoint::LoadOptions o;
  o.tag = tag;
  o.load_module_strict = load_module_strict;
  o.load_optimizer_states = load_optimizer_states;
  o.load_lr_scheduler_states = load_lr_scheduler_states;
  o.load_module_only = load_module_only;
  return in_call("load_checkpoint", [&] {
    return checkpoint::load_engine_checkpoint(*state_, checkpoint::posix_file_system(), load_dir,
                                              o);
  });
}

namespace checkpoint {

int tensor_size(const EngineState& s) { return s.topology ? s.topology->grid().tensor_size() : 1; }
int tensor_rank(const EngineState& s) {
  return tensor_size(s) > 1 ? s.topology->tensor_parallel()->rank() : 0;
}
int model_parallel_rank(const EngineState& s) {
  return (s.pipeline_files ? s.pipeline_files->stage : 0) * tensor_size(s) + tensor_rank(s);
}

std::string precision_name(const Config& config) {
  if (config.bf16.enabled) return "bf16";
  if (config.fp16.enabled) return "fp16";
  return "fp32";
}

nlohmann::json shared_params_json(const EngineState& s) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [alias, owner] : s.shared_params) out[alias] = owner;
  return out;
}

void run_agreed(comm::Communicator& comm, const std::string& what, const std::function<void()>& body) {
  std::string error;
  try {
    body();
  } catch (const Error& e) {
    error = e.what();
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const nlohmann::json::exception& e) {
    error = std::string("malformed checkpoint metadata: ") + e.what();
  } catch (const std::bad_alloc&) {
    // Out of host memory on this rank: the others must still hear of it, or they would wait in
    // the vote below until the communicator's timeout.
    error = "out of host memory (std::bad_alloc)";
  }
  at::Tensor failed = torch::full({1}, error.empty() ? 0.0f : 1.0f);
  if (comm.world_size() > 1) comm.all_reduce(failed, comm::ReduceOp::Max)->wait();
  if (!error.empty()) throw CheckpointError(what + " failed on rank " + std::to_string(comm.rank()) + ": " + error);
  if (failed.item<float>() > 0)
    throw CheckpointError(what + " failed on another rank (see its error); rank " +
                          std::to_string(comm.rank()) + " stops too");
}

}  // namespace checkpoint
}  // namespace deepspeed
