// The GPU tests' guard: without a GPU (or a CUDA libtorch) a test skips, saying why; `ctest -L gpu`
// runs them on the GPU machine (docs/gpu.md). There bench/gpu/run.sh sets DS_EXPECT_GPU=1 and the
// same guard fails instead: a skip on that machine would mean the CUDA path went untested while
// the program still exited 0.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "deepspeed/device.h"

namespace dstest {
// DS_EXPECT_GPU is set and not "0".
inline bool gpu_expected() {
  const char* v = std::getenv("DS_EXPECT_GPU");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}
}  // namespace dstest

#define SKIP_WITHOUT_GPU()                                                                      \
  do {                                                                                          \
    if (!deepspeed::cuda_available()) {                                                         \
      if (dstest::gpu_expected())                                                               \
        GTEST_FAIL() << "DS_EXPECT_GPU is set (bench/gpu/run.sh, the GPU machine) but no GPU "   \
                        "is visible or this libtorch has no CUDA: the CUDA path was not tested";  \
      GTEST_SKIP() << "no GPU: this libtorch has no CUDA or no GPU is visible (the CUDA path "   \
                      "is tested on a GPU machine, docs/gpu.md)";                               \
    }                                                                                           \
  } while (0)
