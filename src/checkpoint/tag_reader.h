// Reading one checkpoint tag folder (layout.h): the manifest, then files on demand, each verified
// against the manifest (size and crc32c, read in chunks) before its header is parsed, and the
// assembly of any range of a parameter's fp32 state from the fragments of whichever ranks saved
// it. Tensor data are read only when asked for, straight into the caller's tensor, so a file
// never has to fit in memory. At most 64 descriptors are held at a time (fewer under a low
// RLIMIT_NOFILE), whatever the number of rank files.
// Thread-safety: none; one reader per thread.
#pragma once
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "checkpoint/file_system.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"

namespace deepspeed {
namespace checkpoint {

struct TrainableInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
};

class TagReader {
 public:
  // Reads tag_dir/manifest.json and checks its format. Throws CheckpointError naming the file
  // (a missing manifest means the save never completed). A tag whose re-save died halfway
  // through its swap is read from its complete replacement (tag_replacement.h).
  TagReader(FileSystem& fs, const std::string& tag_dir);

  const std::string& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }
  const nlohmann::json& meta() const { return manifest_.metadata; }
  int world_size() const { return world_size_; }
  int zero_stage() const { return zero_stage_; }
  const std::string& optimizer_format() const { return optimizer_format_; }
  const std::vector<TrainableInfo>& trainable() const { return trainable_; }
  // Pipeline stages of the saved job (1 without a pipeline); world_size() counts every rank of
  // every stage, so the data-parallel size was world_size() / pipeline_stages().
  int pipeline_stages() const { return pipeline_stages_; }
  // The optimizer-state file of saved rank `rank` (global rank order).
  const std::string& partition_file(int rank) const { return partition_files_.at(rank); }
  // Where the module's tensors are (ModuleFile), and the file with the engine state (counters,
  // scheduler, loss scaler, client state): one model-states file for a plain engine.
  const std::vector<ModuleFile>& module_files() const { return module_files_; }
  const std::string& engine_file() const { return engine_file_; }

  // The header of `name` (relative to the tag folder), the file verified and parsed once. Throws
  // CheckpointError naming the file: missing, truncated, corrupted, not listed in the manifest,
  // unparsable.
  const SafetensorsIndex& file(const std::string& name);
  // The JSON under kMetadataKey of that file's "__metadata__".
  nlohmann::json file_metadata(const std::string& name);
  // Tensor `tensor` of file `name`, read whole; throws CheckpointError naming both when absent.
  at::Tensor tensor(const std::string& name, const std::string& tensor);
  // Reads tensor `tensor` of file `name` into `dst` (same numel; in place when contiguous and of
  // the saved dtype, else converted as Tensor::copy_ does).
  void read_tensor(const std::string& name, const std::string& tensor, at::Tensor dst);
  // Fills `dst` (fp32, numel elements) with state `kind` ("fp32", "exp_avg", "exp_avg_sq") of
  // trainable parameter `param`, elements [offset, offset + numel), from the rank files holding
  // pieces of it, read straight into `dst` when it is contiguous. Throws CheckpointError when
  // the saved pieces do not cover the range.
  void read_range(const std::string& kind, const std::string& param, int64_t offset, at::Tensor dst);
  // What read_range would check, from the headers alone (verifying the files it needs): the
  // pieces cover [offset, offset + numel) and each rank file holds them as fp32 of the listed size.
  void check_range(const std::string& kind, const std::string& param, int64_t offset,
                   int64_t numel);
  // Ranks whose files hold some of [offset, offset + numel) of `param`.
  std::vector<int> ranks_holding(const std::string& param, int64_t offset, int64_t numel) const;

  // ---- tensor-parallel checkpoints (layout.h) ----
  // The saved tensor-parallel size (1 for any other checkpoint) and how each split parameter is
  // cut. By default such a checkpoint reads as the unsplit model: trainable() has unsplit shapes;
  // read_range / check_range take ranges of the unsplit tensor and assemble them from the
  // fragments of each tensor rank's slice (a replicated parameter from tensor rank 0's); the
  // engine and module files are tensor rank 0's (module_tensor merges a split one).
  int tensor_parallel_size() const { return tensor_size_; }
  const std::map<std::string, TensorSplit>& splits() const { return splits_; }
  // From now on reads as rank `t` of a tensor-parallel group of `size` would: trainable() has its
  // slices' shapes, read_range / check_range take ranges of its slices. At the saved size, tensor
  // rank t's own files (its fragments, its mp_rank file): exactly what it saved. At another size
  // (resharding; a checkpoint without tensor parallelism is size 1), each range of the new slice
  // is mapped onto the unsplit tensor by `model_splits` (how the loading model cuts its split
  // parameters) and assembled from the saved slices holding it; module tensors are merged and
  // re-cut one at a time (read_module_tensor). Throws CheckpointError naming the parameter when
  // the model cuts a parameter otherwise than the checkpoint did, or `size` does not divide it.
  // `model_params`: the loading module's parameter names (a pipeline stage holds some layers
  // only; the others' cuts are not compared); null: every saved parameter is the model's.
  // A pipeline's tensor-parallel checkpoint reads the same way, its layer files standing for the
  // mp_rank_TT files (tensor_rank_file).
  void view_as_tensor_rank(int size, int t, const std::map<std::string, TensorSplit>& model_splits,
                           const std::set<std::string>* model_params = nullptr);
  // The module file's tensor `entry`, unsplit: a split one merged in memory from every tensor
  // rank's model file, any other read as it is.
  at::Tensor module_tensor(const ModuleFile& f, const std::string& entry);
  // Its shape as this view sees it (unsplit, this tensor rank's slice, or the resharded slice),
  // from the headers.
  std::vector<int64_t> module_tensor_shape(const ModuleFile& f, const SafetensorsEntry& e) const;
  // Reads it as this view sees it into `dst` (converted as read_tensor does).
  void read_module_tensor(const ModuleFile& f, const std::string& entry, at::Tensor dst);
  // Opens, and so verifies against the manifest, every file read_module_tensor will read for
  // `entry` (a resharded split tensor draws on every tensor rank's file), and checks each holds
  // it: a load checks all it reads before it changes anything. Throws CheckpointError naming the
  // file.
  void check_module_tensor_sources(const ModuleFile& f, const std::string& entry);

 private:
  struct Piece {
    int rank = 0;
    int64_t offset = 0, numel = 0;
  };
  // A file read so far: verified and parsed once; its descriptor is kept open only while it is
  // among the max_open_ most recently read (a checkpoint of a thousand ranks would otherwise
  // hold a thousand descriptors, past the usual soft limit of 1024).
  struct OpenFile {
    SafetensorsIndex index;
    std::unique_ptr<ReadableFile> file;      // null while closed
    std::list<std::string>::iterator recent;  // its place in recent_, while open
  };
  // At most 64, and a quarter of the process's RLIMIT_NOFILE: the rest is the program's.
  static constexpr size_t kMaxOpenFiles = 64;
  [[noreturn]] void bad(const std::string& what) const;
  // The file verified and parsed (descriptor open or not).
  OpenFile& open(const std::string& name);
  // Its descriptor, reopened when it was closed (the size checked again, not the checksum), the
  // least recently read one closed when max_open_ are open.
  ReadableFile& readable(const std::string& name);
  void mark_open(const std::string& name, OpenFile& f);
  const SafetensorsEntry& entry(const std::string& name, const std::string& tensor);
  // Calls visit(rank file, its entry, first element in it, first element in the range, numel)
  // for each saved piece overlapping the range; throws unless they cover it.
  template <class Visit>
  void for_each_piece(const std::string& kind, const std::string& param, int64_t offset,
                      int64_t numel, Visit&& visit);
  // The same within tensor rank t's pieces; `into` is added to the range positions. Returns the
  // elements covered.
  template <class Visit>
  int64_t for_each_piece_of(int t, const std::string& kind, const std::string& param,
                            int64_t offset, int64_t numel, int64_t into, Visit&& visit);
  // The view is one saved tensor rank's own files, read as they are.
  bool own_view() const { return view_ >= 0 && view_size_ == tensor_size_; }
  // How the view cuts `name` (nullptr: it is whole in the view).
  const TensorSplit* view_split(const std::string& name) const;
  const TensorSplit* saved_split(const std::string& name) const;

  FileSystem& fs_;
  std::string dir_;
  Manifest manifest_;
  int world_size_ = 0;
  int zero_stage_ = 0;
  std::string optimizer_format_;
  std::vector<TrainableInfo> trainable_;
  int pipeline_stages_ = 1;
  std::vector<std::string> partition_files_;
  std::vector<ModuleFile> module_files_;
  std::string engine_file_;
  // Per tensor rank: parameter -> saved fragments (one map when not tensor-parallel).
  std::vector<std::map<std::string, std::vector<Piece>>> pieces_;
  int tensor_size_ = 1;
  int view_ = -1;  // the tensor rank viewed as; -1: the unsplit view
  int view_size_ = 1;
  std::map<std::string, TensorSplit> view_splits_;  // resharding: the loading model's cuts
  std::map<std::string, std::vector<int64_t>> unsplit_shapes_;  // trainable parameters'
  std::map<std::string, TensorSplit> splits_;
  std::vector<TrainableInfo> slice_trainable_;  // one tensor rank's (the manifest's list)
  std::map<std::string, OpenFile> files_;
  std::list<std::string> recent_;  // the files with an open descriptor, most recently read first
  size_t max_open_ = kMaxOpenFiles;
};

// The dtype/shape of every tensor of a safetensors file, read from its header alone:
// {"<tensor>": {"dtype": "F32", "shape": [..]}}. Throws CheckpointError naming the file.
nlohmann::json safetensors_tensor_list(FileSystem& fs, const std::string& path);

// "<dir>/latest" trimmed, or "" when there is none. Throws CheckpointError when it is empty.
std::string read_latest_tag(FileSystem& fs, const std::string& dir);

}  // namespace checkpoint
}  // namespace deepspeed
