// A test's deterministic kernels, given back as found (tests/gpu; no GPU needed to compile).
#pragma once
#include <ATen/Context.h>

#include <cstdlib>

namespace dstest {

// Deterministic kernels (the embedding's backward, cuBLAS) so that two runs differ only where
// their arithmetic differs, for one test: the mode goes back as it was when the guard ends, so a
// test does not depend on which ran before it (in torch 2.x the mode also makes torch::empty
// fill with NaN, a kernel on the compute stream). cuBLAS needs CUBLAS_WORKSPACE_CONFIG before
// its first call, which libtorch checks once and caches: ctest's environment
// (tests/CMakeLists.txt) and bench/gpu/run.sh's set it; the setenv only helps a program run by
// hand whose first cuBLAS call comes after it.
class Deterministic {
 public:
  Deterministic()
      : was_(at::globalContext().deterministicAlgorithms()),
        warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()) {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, false);
  }
  ~Deterministic() { at::globalContext().setDeterministicAlgorithms(was_, warn_only_); }
  Deterministic(const Deterministic&) = delete;
  Deterministic& operator=(const Deterministic&) = delete;

 private:
  const bool was_, warn_only_;
};

}  // namespace dstest
