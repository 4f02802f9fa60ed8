// The layout of a checkpoint folder, shared by the engine's save/load, ds_to_fp32 and the tests.
//
//   <save_dir>/latest                                         the tag (no newline), written last
//   <save_dir>/<tag>/mp_rank_00_model_states.safetensors      rank 0: module state + engine state
//   <save_dir>/<tag>/zero_pp_rank_<r>_mp_rank_00_optim_states.safetensors
//                                                             rank r: its fragments + its RNG/loader
//   <save_dir>/<tag>/manifest.json                            rank 0, after every rank's file
//
// Optimizer state is saved as *fragments*: fragment (name, offset, numel) is elements
// [offset, offset + numel) of the flattened trainable parameter `name`. Rank r of a world of N
// saves the fragments of its ZeRO partition: the trainable parameters laid flat in reverse
// registration order, padded to a multiple of N * partition::kAlignment, cut into N equal
// partitions (partition/partition.h). Stage 0 saves the same shares (its state is replicated, so each
// rank writes 1/N of it). A loader at any world size and stage assembles its own share from the
// fragments that overlap it, which is what makes resharding work.
// In an optim file, fragment tensors are named "fp32/<name>", "exp_avg/<name>", "exp_avg_sq/<name>"
// (1-D fp32, numel elements). Engine state travels as JSON in the safetensors "__metadata__"
// under kMetadataKey.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace deepspeed {
namespace checkpoint {

constexpr const char* kLatestFileName = "latest";
constexpr const char* kMetadataKey = "deepspeed_cpp";
constexpr const char* kCheckpointFormat = "deepspeed_cpp.checkpoint";
constexpr int kCheckpointFormatVersion = 1;
// Optimizer state formats (manifest metadata "optimizer.format").
constexpr const char* kAdamFragments = "adam_fragments";  // moments as fragments: reshardable
constexpr const char* kTorchArchive = "torch_archive";    // libtorch's own serialisation, per rank
constexpr const char* kNoOptimizerState = "none";

std::string library_version();
std::string model_states_file_name();          // "mp_rank_00_model_states.safetensors"
std::string optim_states_file_name(int rank);  // "zero_pp_rank_<r>_mp_rank_00_optim_states.safetensors"
// "fp32/<name>" etc.
std::string fragment_tensor_name(const std::string& kind, const std::string& param);

struct Fragment {
  size_t param = 0;     // index into the list of trainable parameters (registration order)
  int64_t offset = 0;   // first element within the flattened parameter
  int64_t numel = 0;
};

// Rank `rank`'s share of parameters with these element counts (see above), in flat order.
// REQUIRES: world_size >= 1, 0 <= rank < world_size.
std::vector<Fragment> partition_fragments(const std::vector<int64_t>& numels, int world_size,
                                          int rank);

// Names a checkpoint-killing point for tests: when the environment variable
// DS_CHECKPOINT_TEST_KILL_AT is "<point>" or "<point>@<tag>" and matches, the process raises
// SIGKILL here (a real, uncatchable death). No effect otherwise.
void test_kill_point(const char* point, const std::string& tag);

}  // namespace checkpoint
}  // namespace deepspeed
