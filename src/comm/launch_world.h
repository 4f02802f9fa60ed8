// The world communicator of an entry point that may be called without init_distributed():
// initialize(), initialize_pipeline(), zero::Init and init_inference.
//
// deepspeed.initialize() calls init_distributed() itself. So a program launched by dsrun or
// torchrun (RANK/WORLD_SIZE set, world size 4) that never called init_distributed() must not run
// each process as a job of its own (rank 0 of 1: the batch counted once per process, every process
// reading all the data, printing, and writing the same checkpoint files). Here, as there, the
// launcher's environment (comm::detect_process_info: dsrun/torchrun, OpenMPI, Slurm) decides.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

// `given` when set; else init_distributed()'s world when it was called; else, when the
// environment says this process is one of several (world size > 1), init_distributed(options) is
// called here and rank 0 prints one line saying so, naming `caller` ("initialize()"); else (no
// launcher variables, or a world of 1) the single-process communicator, as before. First, in every
// case, util::tune_host_allocator() (once per process).
// COLLECTIVE in the launched case (the rendezvous). Throws what init_distributed throws
// (ConfigError for inconsistent variables, CommError for a failed rendezvous).
CommunicatorPtr world_or_launch(const std::string& caller, CommunicatorPtr given,
                                const InitOptions& options = {});

// InitOptions for that call from the caller's config: a path is read by init_distributed itself
// (InitOptions::config_path); a config given as JSON has its "comm_timeout_seconds" taken here by
// the same rule. Throws ConfigError for an invalid comm_timeout_seconds.
InitOptions init_options_for_config(const std::string& config_path, const nlohmann::json& config_json);

}  // namespace comm
}  // namespace deepspeed
