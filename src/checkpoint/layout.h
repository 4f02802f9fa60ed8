// The layout of a checkpoint folder, shared by the engine's save/load, ds_to_fp32 and the tests.
//
//   <save_dir>/latest                                         the tag (no newline), written last
//   <save_dir>/<tag>/mp_rank_00_model_states.safetensors      rank 0: module state + engine state
//   <save_dir>/<tag>/zero_pp_rank_<r>_mp_rank_00_optim_states.safetensors
//                                                             rank r: its fragments + its RNG/loader
//   <save_dir>/<tag>/manifest.json                            rank 0, after every rank's file
//
// A pipeline (stages S x data D) saves DeepSpeed's pipeline layout instead:
//   <tag>/layer_LL-model_states.safetensors        layer LL's module tensors (a tied module: in the
//                                                  file of the first layer using its key), written
//                                                  by a data-parallel rank of the stage holding LL
//   <tag>/mp_rank_SS_model_states.safetensors      stage SS: engine state only (no module tensors)
//   <tag>/zero_pp_rank_D_mp_rank_SS_optim_states.safetensors   stage SS, data-parallel rank D
//   <tag>/manifest.json                            global rank 0; partitions in global rank order
//
// Tensor-parallel training (tensor size T x data D) saves DeepSpeed's mp_rank layout, one model per
// tensor-parallel rank TT, each an ordinary checkpoint of that rank's slices:
//   <tag>/mp_rank_TT_model_states.safetensors      tensor rank TT's module tensors (its slices of
//                                                  split parameters, replicated ones whole) +
//                                                  engine state; by its data-parallel rank 0
//   <tag>/zero_pp_rank_D_mp_rank_TT_optim_states.safetensors   data-parallel rank D of tensor rank
//                                                  TT: the fragments of TT's slices (layout below)
//   <tag>/manifest.json                            global rank 0; partitions in global rank order
//                                                  (rank = D * T + TT) with their "tensor_rank";
//                                                  "tensor_parallel": size, data-parallel size and
//                                                  how every split parameter is cut (TensorSplit)
// Parameter names are those of the stage modules ("layer_LL.<name>", "tied_<key>.<name>"), which
// do not depend on the layout, so the fragments reshard across (S, D) as across world sizes.
//
// Optimizer state is saved as *fragments*: fragment (name, offset, numel) is elements
// [offset, offset + numel) of the flattened trainable parameter `name`. Rank r of a world of N
// saves the fragments of its ZeRO partition: the trainable parameters laid flat in reverse
// registration order, padded to a multiple of N * partition::kAlignment, cut into N equal
// partitions (partition/partition.h). Stage 0 saves the same shares (its state is replicated, so each
// rank writes 1/N of it). A loader at any world size and stage assembles its own share from the
// fragments that overlap it, which is what makes resharding work.
// In an optim file, fragment tensors are named "fp32/<name>", "exp_avg/<name>", "exp_avg_sq/<name>"
// (1-D fp32, numel elements), and the moments the optimizer keeps (Adam's two, Lion's exp_avg,
// Adagrad's "sum/<name>"; state_kinds below). Engine state travels as JSON in the safetensors "__metadata__"
// under kMetadataKey.
#pragma once
#include <cstdint>
#include <functional>
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
constexpr const char* kLionFragments = "lion_fragments";  // Lion's exp_avg as fragments: the same
constexpr const char* kAdagradFragments = "adagrad_fragments";  // Adagrad's sum: the same
constexpr const char* kSgdFragments = "sgd_fragments";  // SGD's momentum_buffer: the same
constexpr const char* kTorchArchive = "torch_archive";    // libtorch's own serialisation, per rank
constexpr const char* kNoOptimizerState = "none";

// The fragment kinds an optim file of `format` holds per parameter: "fp32", then the moments
// ("exp_avg", "exp_avg_sq" for Adam; "exp_avg" for Lion; "sum" for Adagrad; "momentum_buffer"
// for SGD); "fp32" alone for any other format.
std::vector<std::string> state_kinds(const std::string& format);
// Whether `format` saves the optimizer's state as fragments (and so reshards).
bool is_fragment_format(const std::string& format);

std::string library_version();
// "mp_rank_<MM>_model_states.safetensors" (MM: two digits; the model-parallel rank: the
// pipeline stage, the tensor rank, or stage * tensor size + tensor rank with both; else 0).
std::string model_states_file_name(int mp_rank = 0);
// "zero_pp_rank_<r>_mp_rank_<MM>_optim_states.safetensors": data-parallel rank r of
// model-parallel rank MM.
std::string optim_states_file_name(int rank, int mp_rank = 0);
// "layer_<LL>-model_states.safetensors" (LL: at least two digits); with a tensor rank (>= 0, a
// pipeline with tensor parallelism) "layer_<LL>-model_<TT>-model_states.safetensors".
std::string layer_file_name(int64_t layer, int tensor_rank = -1);


// A file of module tensors: tensor <name> in it is the module's <prefix><name>. A plain engine's
// checkpoint has one, {model_states_file_name(), ""}; a pipeline's one per layer.
struct ModuleFile {
  std::string file;
  std::string prefix;
  int64_t layer = -1;  // pipeline: the global layer index the file is named after
};
// Module file `f` (tensor rank 0's) as tensor rank `t` wrote it: a layer file's
// layer_LL-model_TT, else mp_rank_TT (a tensor-parallel checkpoint without a pipeline).
std::string tensor_rank_file(const ModuleFile& f, int t);

// How a pipeline stage lays out its part of a checkpoint (set by initialize_pipeline).
struct PipelineFiles {
  int stage = 0;
  int stages = 1;
  std::vector<int64_t> bounds;   // stage s holds layers [bounds[s], bounds[s + 1])
  std::vector<ModuleFile> all;   // every layer file of the whole model, in layer order
  // The files stage `s` writes: those named after a layer it holds.
  std::vector<ModuleFile> written_by(int s) const;
};
// "fp32/<name>" etc.
std::string fragment_tensor_name(const std::string& kind, const std::string& param);

// How a parameter of tensor-parallel training is cut (deepspeed::tp::SplitDim): along `dim`, each
// of `parts` equal blocks of that dimension split in `size` equal slices on its own; rank t keeps
// slice t of every block, stacked in block order. dim 0 of any shape, or dim 1 of a 2-D tensor.
struct TensorSplit {
  int dim = 0;
  int parts = 1;
};
// The unsplit shape of a slice of shape `local` cut by `split` over `size` ranks.
std::vector<int64_t> unsplit_shape(std::vector<int64_t> local, const TensorSplit& split, int size);
// Elements [offset, offset + numel) of the flattened unsplit tensor `whole`, as runs each
// contiguous in one rank's flattened slice: visit(rank, first element in the slice, position in
// the range, count), in range order. Throws CheckpointError for a dim it cannot map.
void for_each_slice_run(const std::vector<int64_t>& whole, const TensorSplit& split, int size,
                        int64_t offset, int64_t numel,
                        const std::function<void(int, int64_t, int64_t, int64_t)>& visit);
// The other way: elements [offset, offset + numel) of rank `rank`'s flattened slice, as runs each
// contiguous in the unsplit tensor: visit(first element in the unsplit tensor, position in the
// range, count), in range order.
void for_each_unsplit_run(const std::vector<int64_t>& whole, const TensorSplit& split, int size,
                          int rank, int64_t offset, int64_t numel,
                          const std::function<void(int64_t, int64_t, int64_t)>& visit);

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
