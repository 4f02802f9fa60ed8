#include "support/torch_save_files.h"

#include <sys/wait.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdio>
#include <stdexcept>
#include <vector>

#include "support/files.h"

namespace dstest {

deepspeed::checkpoint::NamedTensors read_torch_save(const std::string& path) {
  const std::string bytes = read_bytes(path);
  const c10::IValue value = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  if (!value.isGenericDict())
    throw std::runtime_error("'" + path + "' holds a " + value.tagKind() + ", not a dict");
  deepspeed::checkpoint::NamedTensors out;
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString() || !item.value().isTensor())
      throw std::runtime_error("'" + path + "': an item that is not string -> tensor");
    out.emplace_back(item.key().toStringRef(), item.value().toTensor());
  }
  return out;
}

bool python_has_torch() {
  return std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") == 0;
}

std::string python_compare_torch_save(const std::string& torch_save_path,
                                      const std::string& safetensors_path) {
  const std::string log = torch_save_path + ".compare.log";
  const std::string script = source_dir() + "/tests/support/torch_load_compare.py";
  const int status = std::system(("/usr/bin/python3 " + script + " " + torch_save_path + " " +
                                  safetensors_path + " > " + log + " 2>&1")
                                     .c_str());
  const std::string output = read_bytes(log);
  std::remove(log.c_str());
  return (WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "ok\n" : "failed\n") + output;
}

}  // namespace dstest
