// Writes one state dict in both weight formats deepspeed.cpp exports (torch.save and
// safetensors) through the library's writers, then reads each file back (and READ_ALSO, e.g. a
// file PyTorch wrote) with deepspeed::load_state_dict_file, best of `reps`, printing one JSON
// line per row:
//   bench_weights_export SPEC.json OUT_DIR [reps=3] [READ_ALSO]
//   bench_weights_export --read_once FILE    one load_state_dict_file of FILE, no warm-up: the
//                                            first read of a fresh process
// SPEC.json: {"dtype": "fp32"|"bf16", "tensors": [[name, [shape...]], ...]}
// (bench/weights_export.py writes it and runs PyTorch's torch.save on the same shapes beside
// this). Values are seeded normal draws; files go to OUT_DIR/dscpp.bin and
// OUT_DIR/dscpp.safetensors (left there for the script to read back).
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "best_seconds.h"
#include "bench_args.h"
#include "checkpoint/weights_file.h"
#include "deepspeed/state_dict_file.h"

namespace ckpt = deepspeed::checkpoint;

void print_read(const std::string& path, uint64_t bytes, double seconds) {
  std::printf("{\"op\": \"read\", \"format\": \"%s\", \"path\": \"%s\", \"bytes\": %llu, "
              "\"seconds\": %.6f}\n",
              ckpt::weights_format_name(ckpt::weights_format_for(path)), path.c_str(),
              static_cast<unsigned long long>(bytes), seconds);
}

int main(int argc, char** argv) {
  BenchArgs args(argc, argv,
                 "Usage: bench_weights_export SPEC.json OUT_DIR [reps=3] [READ_ALSO] | "
                 "--read_once FILE");
  args.at_most(4);
  if (argc == 3 && std::string(argv[1]) == "--read_once") {
    const auto start = std::chrono::steady_clock::now();
    const auto tensors = deepspeed::load_state_dict_file(argv[2]);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    uint64_t bytes = 0;
    for (const auto& [name, t] : tensors) bytes += t.nbytes();
    print_read(argv[2], bytes, s);
    return 0;
  }
  if (argc < 3) args.fail("SPEC.json and OUT_DIR are required");
  const std::string out_dir = argv[2];
  const int reps = static_cast<int>(args.number(3, 3));
  if (reps < 1) args.fail("reps must be at least 1");
  nlohmann::json spec;
  std::ifstream(argv[1]) >> spec;
  const std::string dtype_name = spec.at("dtype");
  const at::ScalarType dtype = dtype_name == "bf16" ? at::kBFloat16 : at::kFloat;
  at::manual_seed(0);
  ckpt::NamedTensors tensors;
  uint64_t bytes = 0;
  for (const auto& t : spec.at("tensors")) {
    tensors.emplace_back(t.at(0).get<std::string>(),
                         at::randn(t.at(1).get<std::vector<int64_t>>()).to(dtype));
    bytes += tensors.back().second.nbytes();
  }
  auto& fs = ckpt::posix_file_system();
  std::vector<std::string> written;
  for (const auto format : {ckpt::WeightsFormat::torch_save, ckpt::WeightsFormat::safetensors}) {
    const bool pickle = format == ckpt::WeightsFormat::torch_save;
    const std::string path = out_dir + (pickle ? "/dscpp.bin" : "/dscpp.safetensors");
    const double s = best_seconds(reps, [&] { ckpt::write_weights(fs, path, format, tensors); });
    std::printf("{\"op\": \"write\", \"format\": \"%s\", \"path\": \"%s\", \"bytes\": %llu, "
                "\"seconds\": %.6f}\n",
                ckpt::weights_format_name(format), path.c_str(),
                static_cast<unsigned long long>(bytes), s);
    written.push_back(path);
  }
  tensors.clear();  // the reads below hold one state dict at a time
  if (argc > 4) written.push_back(argv[4]);
  for (const auto& path : written) {
    print_read(path, bytes, best_seconds(reps, [&] { deepspeed::load_state_dict_file(path); }));
  }
  return 0;
}
