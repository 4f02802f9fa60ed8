// The 1-bit optimizer family as one list. What holds for all three (stage 0 only in the config
// check, built by the engine and not by make_optimizer, one parameter group, the estimator's
// spelling and its check of it) asks here, so a fourth member added to the list is known to every
// such rule; code that builds, reads or counts one particular type (the estimator's per-type
// bytes) still names it. Header only and free of libtorch: src/config includes it too.
#pragma once
#include <string>

#include "util/ascii.h"

namespace deepspeed::optim {

// DeepSpeed's spellings; their momentum exchange is the engine's data-parallel collective.
inline constexpr const char* kOneBitOptimizerTypes[] = {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"};

// The canonical spelling of `type` (any case) when it is a 1-bit optimizer, else "".
inline std::string onebit_optimizer_type(const std::string& type) {
  const std::string lower = ascii_lower(type);
  for (const char* name : kOneBitOptimizerTypes)
    if (ascii_lower(name) == lower) return name;
  return "";
}

// Whether `type` (any case) is one of the 1-bit optimizers.
inline bool is_onebit_optimizer(const std::string& type) {
  return !onebit_optimizer_type(type).empty();
}

}  // namespace deepspeed::optim
