// PipelineRuntime: what a PipelineEngine holds beside its Engine state — the stage's place in the
// pipeline, its layers, its links to the other stages and its schedule counters. Filled once by
// initialize_pipeline (initialize_pipeline.cpp), read by the schedule interpreter
// (schedule_interpreter.cpp) and the engine's accessors (pipeline_engine.cpp); private to
// src/pipe (include/deepspeed/pipe.h only declares it).
#pragma once
#include <memory>
#include <vector>

#include "deepspeed/pipe.h"
#include "deepspeed/topology.h"
#include "pipe/stage_link.h"
#include "pipe/stage_module.h"
#include "pipe/tied_layers.h"

namespace deepspeed {
namespace pipe {

struct PipelineRuntime {
  PipelineModule spec;
  std::shared_ptr<comm::Topology> topology;
  comm::CommunicatorPtr pipe;  // numbered by stage
  int stage = 0;
  int stages = 1;
  Partition partition;
  StageModule module{nullptr};
  std::vector<TiedGroup> tied;
  std::unique_ptr<StageLink> link;  // activations and gradients to and from the neighbours
  // Forward activations awaiting their backward: now, and the most so far.
  int held = 0;
  int max_held = 0;
  PipelineEngine::BatchTiming timing;
};

}  // namespace pipe
}  // namespace deepspeed
