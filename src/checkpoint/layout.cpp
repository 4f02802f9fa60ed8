#include "checkpoint/layout.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "deepspeed/errors.h"
#include "partition/partition.h"

namespace deepspeed {
namespace checkpoint {

std::string library_version() { return "0.1.0"; }

std::vector<std::string> state_kinds(const std::string& format) {
  if (format == kAdamFragments) return {"fp32", "exp_avg", "exp_avg_sq"};
  if (format == kLionFragments) return {"fp32", "exp_avg"};
  if (format == kAdagradFragments) return {"fp32", "sum"};
  if (format == kSgdFragments) return {"fp32", "momentum_buffer"};
  return {"fp32"};
}

bool is_fragment_format(const std::string& format) {
  return format == kAdamFragments || format == kLionFragments || format == kAdagradFragments ||
         format == kSgdFragments;
}

namespace {
std::string two_digits(int64_t i) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%02lld", static_cast<long long>(i));
  return buf;
}
}  // namespace

std::string model_states_file_name(int mp_rank) {
  return "mp_rank_" + two_digits(mp_rank) + "_model_states.safetensors";
}

std::string optim_states_file_name(int rank, int mp_rank) {
  return "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_" + two_digits(mp_rank) +
         "_optim_states.safetensors";
}

std::string layer_file_name(int64_t layer, int tensor_rank) {
  const std::string model = tensor_rank >= 0 ? "-model_" + two_digits(tensor_rank) : "";
  return "layer_" + two_digits(layer) + model + "-model_states.safetensors";
}

std::string tensor_rank_file(const ModuleFile& f, int t) {
  return f.layer >= 0 ? layer_file_name(f.layer, t) : model_states_file_name(t);
}

std::vector<ModuleFile> PipelineFiles::written_by(int s) const {
  std::vector<ModuleFile> out;
  for (const auto& f : all)
    if (f.layer >= bounds.at(s) && f.layer < bounds.at(s + 1)) out.push_back(f);
  return out;
}

std::string fragment_tensor_name(const std::string& kind, const std::string& param) {
  return kind + "/" + param;
}

std::vector<Fragment> partition_fragments(const std::vector<int64_t>& numels, int world_size,
                                          int rank) {
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  const auto layout = make_partition_layout(total, world_size);
  const int64_t begin = layout.begin(rank), end = layout.end(rank);
  std::vector<Fragment> out;
  int64_t flat = 0;  // flat offset of parameter k; reverse registration order
  for (size_t k = numels.size(); k-- > 0;) {
    const int64_t lo = std::max(begin, flat), hi = std::min(end, flat + numels[k]);
    if (hi > lo) out.push_back({k, lo - flat, hi - lo});
    flat += numels[k];
  }
  return out;
}

std::vector<int64_t> unsplit_shape(std::vector<int64_t> local, const TensorSplit& split, int size) {
  if (split.dim >= 0 && split.dim < static_cast<int>(local.size())) local[split.dim] *= size;
  return local;
}

namespace {

// How a split cuts the unsplit tensor `whole` over `size` ranks, checked once for both mappings.
// rows: a "row" is one index of dim 0 (row_len elements); block (part p, rank t) is rows
//   [p * per_part + t * per_rank, ... + per_rank) of the whole, rows [p * per_rank, ...) of t.
// columns: row i's columns [t * per_rank, (t + 1) * per_rank) are row i of rank t's slice.
struct SliceGeometry {
  bool rows = false;
  int64_t row_len = 0, per_part = 0, per_rank = 0;
};

SliceGeometry geometry(const std::vector<int64_t>& whole, const TensorSplit& split, int size) {
  int64_t total = 1;
  for (int64_t d : whole) total *= d;
  const bool rows = split.dim == 0 && !whole.empty() && split.parts >= 1 && size >= 1 &&
                    whole[0] % (int64_t{split.parts} * size) == 0;
  const bool columns =
      split.dim == 1 && whole.size() == 2 && split.parts == 1 && size >= 1 && whole[1] % size == 0;
  if (!rows && !columns) {
    std::string shape;
    for (size_t i = 0; i < whole.size(); ++i) shape += (i ? ", " : "") + std::to_string(whole[i]);
    throw CheckpointError("tensor-parallel checkpoint: cannot split a tensor of shape [" + shape +
                          "] along dim " + std::to_string(split.dim) + " in " +
                          std::to_string(split.parts) + " block(s) over " + std::to_string(size) +
                          " ranks");
  }
  SliceGeometry g;
  g.rows = rows;
  g.row_len = rows ? total / whole[0] : whole[1];
  g.per_part = rows ? whole[0] / split.parts : 0;
  g.per_rank = rows ? g.per_part / size : whole[1] / size;
  return g;
}

}  // namespace

void for_each_slice_run(const std::vector<int64_t>& whole, const TensorSplit& split, int size,
                        int64_t offset, int64_t numel,
                        const std::function<void(int, int64_t, int64_t, int64_t)>& visit) {
  const SliceGeometry g = geometry(whole, split, size);
  for (int64_t e = offset, end = offset + numel; e < end;) {
    int t;
    int64_t local, run_end;
    if (g.rows) {
      const int64_t r = e / g.row_len, part = r / g.per_part, in_part = r % g.per_part;
      t = static_cast<int>(in_part / g.per_rank);
      local = (part * g.per_rank + in_part % g.per_rank) * g.row_len + e % g.row_len;
      run_end = (part * g.per_part + (t + 1) * g.per_rank) * g.row_len;
    } else {
      const int64_t i = e / g.row_len, j = e % g.row_len;
      t = static_cast<int>(j / g.per_rank);
      local = i * g.per_rank + j % g.per_rank;
      run_end = i * g.row_len + (t + 1) * g.per_rank;
    }
    const int64_t n = std::min(end, run_end) - e;
    visit(t, local, e - offset, n);
    e += n;
  }
}

void for_each_unsplit_run(const std::vector<int64_t>& whole, const TensorSplit& split, int size,
                          int rank, int64_t offset, int64_t numel,
                          const std::function<void(int64_t, int64_t, int64_t)>& visit) {
  const SliceGeometry g = geometry(whole, split, size);
  for (int64_t e = offset, end = offset + numel; e < end;) {
    int64_t unsplit, run_end;
    if (g.rows) {  // local row lr: block `part`, row `within` of this rank's piece of it
      const int64_t lr = e / g.row_len, part = lr / g.per_rank, within = lr % g.per_rank;
      unsplit = (part * g.per_part + rank * g.per_rank + within) * g.row_len + e % g.row_len;
      run_end = (part + 1) * g.per_rank * g.row_len;
    } else {
      const int64_t i = e / g.per_rank, j = e % g.per_rank;
      unsplit = i * g.row_len + rank * g.per_rank + j;
      run_end = (i + 1) * g.per_rank;
    }
    const int64_t n = std::min(end, run_end) - e;
    visit(unsplit, e - offset, n);
    e += n;
  }
}

void test_kill_point(const char* point, const std::string& tag) {
  const char* spec = std::getenv("DS_CHECKPOINT_TEST_KILL_AT");
  if (!spec || !*spec) return;
  std::string s(spec);
  const auto at = s.find('@');
  if (s.substr(0, at) != point) return;
  if (at != std::string::npos && s.substr(at + 1) != tag) return;
  std::raise(SIGKILL);
}

}  // namespace checkpoint
}  // namespace deepspeed
