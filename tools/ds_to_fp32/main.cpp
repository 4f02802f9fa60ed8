// ds_to_fp32: a deepspeed.cpp checkpoint (any world size, ZeRO stage, precision) to full fp32
// weights, the counterpart of DeepSpeed's zero_to_fp32.py:
//   ds_to_fp32 <save_dir or tag folder> <output folder | output file> [--tag TAG]
//              [--max_shard_size SIZE] [--exclude_frozen_parameters] [--safe_serialization]
// An output folder (created if missing, as zero_to_fp32's output_dir) gets Hugging Face's layout,
// split by --max_shard_size (default 5GB), in zero_to_fp32's formats: torch.save files
// (pytorch_model.bin, or pytorch_model-0000i-of-0000n.bin and pytorch_model.bin.index.json), or
// with --safe_serialization safetensors (model.safetensors, or model-0000i-of-0000n.safetensors
// and model.safetensors.index.json) (src/checkpoint/shard_plan.h). An output path ending in
// ".safetensors", ".bin", ".pt" or ".pth" gets one file of that format, unsplit.
// Every checkpoint file is verified against the manifest first. Exit status 0 on success, 1 on
// any error (printed).
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "checkpoint/consolidate.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard_plan.h"
#include "checkpoint/weights_file.h"
#include "deepspeed/errors.h"

namespace {

namespace ckpt = deepspeed::checkpoint;

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string input, output, tag, max_shard_size = ckpt::kDefaultMaxShardSize;
  bool exclude_frozen = false, safe_serialization = false;
  CLI::App app{
      "Consolidate a deepspeed.cpp checkpoint into fp32 weights (torch.save or safetensors)"};
  app.add_option("checkpoint", input, "save folder (with 'latest') or a tag folder")->required();
  app.add_option("output", output,
                 "a folder (created if missing) for pytorch_model.bin (model.safetensors with "
                 "--safe_serialization) or its shards and index, or a path ending in "
                 ".safetensors, .bin, .pt or .pth for one file")
      ->required();
  app.add_option("-t,--tag", tag, "checkpoint tag (default: the content of 'latest')");
  auto* shard_option = app.add_option(
      "--max_shard_size", max_shard_size,
      "largest shard of an output folder: bytes, or a number with KB/MB/GB/TB (powers of 1000) "
      "or KiB/MiB/GiB/TiB (powers of 1024); default 5GB");
  app.add_flag("--exclude_frozen_parameters", exclude_frozen,
               "leave out parameters that were not trained (buffers stay)");
  app.add_flag("--safe_serialization", safe_serialization,
               "an output folder gets safetensors files (default: torch.save files, as "
               "zero_to_fp32)");
  CLI11_PARSE(app, argc, argv);

  // Every argument is checked before the (long) consolidation.
  const bool to_file = (ends_with(output, ".safetensors") || ends_with(output, ".bin") ||
                        ends_with(output, ".pt") || ends_with(output, ".pth")) &&
                       !is_directory(output);
  if (to_file && shard_option->count() > 0)
    throw deepspeed::ConfigError("--max_shard_size '" + max_shard_size +
                                 "' splits an output folder, but output '" + output +
                                 "' is a file: give a folder to shard into");
  const ckpt::WeightsFormat format =
      to_file ? ckpt::weights_format_for(output)
              : (safe_serialization ? ckpt::WeightsFormat::safetensors
                                    : ckpt::WeightsFormat::torch_save);
  if (to_file && safe_serialization && format != ckpt::WeightsFormat::safetensors)
    throw deepspeed::ConfigError("--safe_serialization asks for safetensors, but output '" +
                                 output + "' names a torch.save file: end it in .safetensors");
  const uint64_t shard_bytes = ckpt::parse_byte_size(max_shard_size, "--max_shard_size");
  auto& fs = ckpt::posix_file_system();
  const std::string dir = ckpt::resolve_tag_dir(fs, input, tag);
  auto tensors = ckpt::consolidate_fp32(fs, dir, exclude_frozen);
  int64_t numel = 0;
  for (auto& [name, t] : tensors) numel += t.numel();
  const ckpt::SafetensorsMetadata metadata = {{"format", "pt"}};  // zero_to_fp32's
  if (to_file) {
    ckpt::write_weights(fs, output, format, tensors, metadata);
    std::printf("ds_to_fp32: %zu tensors, %lld elements from %s -> %s (%s)\n", tensors.size(),
                static_cast<long long>(numel), dir.c_str(), output.c_str(),
                ckpt::weights_format_name(format));
    return 0;
  }
  const auto result = ckpt::write_hf_export(fs, output, format, tensors, shard_bytes, metadata);
  for (const auto& name : result.removed)
    std::printf("ds_to_fp32: removed %s of an earlier export\n",
                ckpt::join_path(output, name).c_str());
  const auto& plan = result.plan;
  const std::string written = ckpt::join_path(
      output, plan.sharded() ? ckpt::hf_index_file_name(format) : plan.shards[0].file);
  std::printf("ds_to_fp32: %zu tensors, %lld elements (%llu bytes) from %s -> %s", tensors.size(),
              static_cast<long long>(numel), static_cast<unsigned long long>(plan.total_size),
              dir.c_str(), written.c_str());
  if (plan.sharded())
    std::printf(" and %zu shards (--max_shard_size %s)", plan.shards.size(),
                max_shard_size.c_str());
  std::printf("\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ds_to_fp32: error: %s\n", e.what());
  return 1;
}
