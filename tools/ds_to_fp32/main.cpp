// ds_to_fp32: a deepspeed.cpp checkpoint (any world size, ZeRO stage, precision) to one
// safetensors file of full fp32 weights, the counterpart of DeepSpeed's zero_to_fp32.py:
//   ds_to_fp32 <save_dir or tag folder> <output.safetensors | existing folder> [--tag TAG]
//              [--exclude_frozen_parameters]
// An existing folder as output gets <folder>/model.safetensors (zero_to_fp32's name with
// --safe_serialization). Every checkpoint file is verified against the manifest first. Exit
// status 0 on success, 1 on any error (printed).
#include <sys/stat.h>

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "checkpoint/consolidate.h"
#include "checkpoint/safetensors.h"

namespace {

// zero_to_fp32 writes into an output folder; a path naming a folder here gets this file in it.
constexpr const char* kFileInFolder = "model.safetensors";

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

int main(int argc, char** argv) try {
  std::string input, output, tag;
  bool exclude_frozen = false;
  CLI::App app{"Consolidate a deepspeed.cpp checkpoint into fp32 safetensors"};
  app.add_option("checkpoint", input, "save folder (with 'latest') or a tag folder")->required();
  app.add_option("output", output,
                 std::string("the .safetensors file to write, or an existing folder to write ") +
                     kFileInFolder + " into")
      ->required();
  app.add_option("-t,--tag", tag, "checkpoint tag (default: the content of 'latest')");
  app.add_flag("--exclude_frozen_parameters", exclude_frozen,
               "leave out parameters that were not trained (buffers stay)");
  CLI11_PARSE(app, argc, argv);

  auto& fs = deepspeed::checkpoint::posix_file_system();
  const std::string dir = deepspeed::checkpoint::resolve_tag_dir(fs, input, tag);
  if (is_directory(output)) output = deepspeed::checkpoint::join_path(output, kFileInFolder);
  auto tensors = deepspeed::checkpoint::consolidate_fp32(fs, dir, exclude_frozen);
  deepspeed::checkpoint::write_safetensors(fs, output, tensors, {{"format", "pt"}});
  int64_t numel = 0;
  for (auto& [name, t] : tensors) numel += t.numel();
  std::printf("ds_to_fp32: %zu tensors, %lld elements from %s -> %s\n", tensors.size(),
              static_cast<long long>(numel), dir.c_str(), output.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ds_to_fp32: error: %s\n", e.what());
  return 1;
}
