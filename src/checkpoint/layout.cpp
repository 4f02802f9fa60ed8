#include "checkpoint/layout.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "partition/partition.h"

namespace deepspeed {
namespace checkpoint {

std::string library_version() { return "0.1.0"; }

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

std::string layer_file_name(int64_t layer) {
  return "layer_" + two_digits(layer) + "-model_states.safetensors";
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
