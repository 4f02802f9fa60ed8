// The GPU tests' guard: without a GPU (or a CUDA libtorch) a test skips, saying why; `ctest -L gpu`
// runs them on the GPU machine (docs/gpu.md).
#pragma once
#include <gtest/gtest.h>

#include "deepspeed/device.h"

#define SKIP_WITHOUT_GPU()                                                                    \
  do {                                                                                        \
    if (!deepspeed::cuda_available())                                                         \
      GTEST_SKIP() << "no GPU: this libtorch has no CUDA or no GPU is visible (the CUDA path " \
                      "is tested on a GPU machine, docs/gpu.md)";                             \
  } while (0)
