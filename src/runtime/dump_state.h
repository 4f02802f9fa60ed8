// dump_state: what DeepSpeed prints after initialize() when the config's "dump_state" is true
// (print_configuration of the engine: each of its attributes). Here the engine's composition as
// the config and the world resolved it, one "name ... value" line each, then the config document
// as read ("auto" keys filled).
#pragma once
#include <string>

#include "runtime/engine_state.h"

namespace deepspeed {

// The dump, lines ending in newlines. Reads no collective; the memory figures are this rank's.
std::string describe_engine_state(const EngineState& s);

}  // namespace deepspeed
