// torch.save files for tests: read back through libtorch's own reader (torch::pickle_load, the
// C++ counterpart of Python's torch.load), and checked by Python's torch.load itself.
#pragma once
#include <string>

#include "checkpoint/safetensors.h"

namespace dstest {

// The state dict a torch.save file holds, in its order: every key a string, every value a
// tensor (else a test failure is thrown as std::runtime_error naming the file).
deepspeed::checkpoint::NamedTensors read_torch_save(const std::string& path);

// True when /usr/bin/python3 imports torch (Debian's python3-torch); tests that need it skip
// otherwise, saying so.
bool python_has_torch();

// Runs tests/support/torch_load_compare.py: Python's torch.load(weights_only=True) reads
// `torch_save_path` and must hold a dict equal, key order, dtypes and values, to the
// safetensors file `safetensors_path`. Returns its output, prefixed "ok\n" when it matched.
std::string python_compare_torch_save(const std::string& torch_save_path,
                                      const std::string& safetensors_path);

}  // namespace dstest
