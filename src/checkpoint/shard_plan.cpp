#include "checkpoint/shard_plan.h"

#include <cctype>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace checkpoint {
namespace {

[[noreturn]] void bad_size(const std::string& what, const std::string& text,
                           const std::string& why) {
  throw ConfigError(what + " '" + text + "': " + why);
}

constexpr const char* kSizeForms =
    "not a size (an integer of bytes, or a number with KB, MB, GB, TB (powers of 1000) or KiB, "
    "MiB, GiB, TiB (powers of 1024), e.g. 5GB)";

// Bytes per unit, keyed by the lower-case unit; "" is a bare byte count.
uint64_t unit_bytes(const std::string& unit, bool* known) {
  static const std::map<std::string, uint64_t> units = {{"", 1},
                                                        {"kb", 1000ull},
                                                        {"mb", 1000ull * 1000},
                                                        {"gb", 1000ull * 1000 * 1000},
                                                        {"tb", 1000ull * 1000 * 1000 * 1000},
                                                        {"kib", 1ull << 10},
                                                        {"mib", 1ull << 20},
                                                        {"gib", 1ull << 30},
                                                        {"tib", 1ull << 40}};
  const auto it = units.find(unit);
  *known = it != units.end();
  return *known ? it->second : 0;
}

std::string shard_file_name(size_t i, size_t n, WeightsFormat format) {
  char name[80];
  if (format == WeightsFormat::safetensors)
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  else
    std::snprintf(name, sizeof name, "pytorch_model-%05zu-of-%05zu.bin", i + 1, n);
  return name;
}

// <prefix><digits>-of-<digits><suffix>
bool is_numbered_shard_name(const std::string& name, const std::string& prefix,
                            const std::string& suffix) {
  const std::string middle = "-of-";
  if (name.rfind(prefix, 0) != 0 || name.size() <= prefix.size() + suffix.size() ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  const std::string numbers =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  const size_t split = numbers.find(middle);
  if (split == std::string::npos || split == 0 || split + middle.size() == numbers.size())
    return false;
  for (size_t i = 0; i < numbers.size(); ++i) {
    if (i >= split && i < split + middle.size()) continue;
    if (!std::isdigit(static_cast<unsigned char>(numbers[i]))) return false;
  }
  return true;
}

bool is_index_file_name(const std::string& name) {
  return name == kHfIndexFileName || name == kHfTorchSaveIndexFileName;
}

// The digits of `s` from `pos` on, advancing pos past them.
std::string take_digits(const std::string& s, size_t& pos) {
  const size_t begin = pos;
  while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) ++pos;
  return s.substr(begin, pos - begin);
}

}  // namespace

std::string hf_single_file_name(WeightsFormat format) {
  return format == WeightsFormat::safetensors ? kHfSingleFileName : kHfTorchSaveFileName;
}

std::string hf_index_file_name(WeightsFormat format) {
  return format == WeightsFormat::safetensors ? kHfIndexFileName : kHfTorchSaveIndexFileName;
}

uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  size_t pos = 0;
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  const std::string whole = take_digits(text, pos);
  std::string fraction;
  const bool has_point = pos < text.size() && text[pos] == '.';
  if (has_point) fraction = take_digits(text, ++pos);
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  std::string unit;
  while (pos < text.size() && std::isalpha(static_cast<unsigned char>(text[pos])))
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[pos++])));
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  bool known = false;
  const uint64_t multiplier = unit_bytes(unit, &known);
  // A fraction of a byte means nothing: "1.5" without a unit is refused.
  if (pos != text.size() || !known || (whole.empty() && fraction.empty()) ||
      (has_point && unit.empty()))
    bad_size(what, text, kSizeForms);
  // Exact arithmetic: 19 digits fit in 64 bits, and 64 x 41 bits in 128.
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (whole.size() > 19) bad_size(what, text, "more than 2^63 bytes");
  unsigned __int128 bytes =
      static_cast<unsigned __int128>(whole.empty() ? 0 : std::stoull(whole)) * multiplier;
  const std::string digits = fraction.substr(0, 18);  // finer than a byte below a TiB anyway
  if (!digits.empty()) {
    unsigned __int128 scale = 1;
    for (size_t i = 0; i < digits.size(); ++i) scale *= 10;
    bytes += static_cast<unsigned __int128>(std::stoull(digits)) * multiplier / scale;
  }
  if (bytes > kMax) bad_size(what, text, "more than 2^63 bytes");
  if (bytes == 0)
    bad_size(what, text, "a shard of 0 bytes can hold nothing (give at least 1 byte)");
  return static_cast<uint64_t>(bytes);
}

std::string ShardPlan::index_json() const {
  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& shard : shards)
    for (const auto& name : shard.names) weight_map[name] = shard.file;
  const nlohmann::json index = {{"metadata", {{"total_size", total_size}}},
                                {"weight_map", weight_map}};
  return index.dump(2) + "\n";  // nlohmann's objects keep keys sorted, as sort_keys=True
}

ShardPlan plan_shards(const std::vector<std::pair<std::string, uint64_t>>& sizes,
                      uint64_t max_shard_size, WeightsFormat format) {
  ShardPlan plan;
  plan.format = format;
  ShardPlan::Shard current;
  for (const auto& [name, bytes] : sizes) {
    plan.total_size += bytes;
    // Alone, and ahead of the shard being filled (huggingface_hub's order).
    if (bytes > max_shard_size) {
      plan.shards.push_back({"", {name}, bytes});
      continue;
    }
    if (current.bytes + bytes > max_shard_size) {  // never empty here: bytes <= max_shard_size
      plan.shards.push_back(std::move(current));
      current = {};
    }
    current.names.push_back(name);
    current.bytes += bytes;
  }
  // The last one; with no tensors at all, one empty file still marks the export.
  if (!current.names.empty() || plan.shards.empty()) plan.shards.push_back(std::move(current));
  const size_t n = plan.shards.size();
  for (size_t i = 0; i < n; ++i)
    plan.shards[i].file = n == 1 ? hf_single_file_name(format) : shard_file_name(i, n, format);
  return plan;
}

ShardPlan plan_shards(const NamedTensors& tensors, uint64_t max_shard_size,
                      WeightsFormat format) {
  std::vector<std::pair<std::string, uint64_t>> sizes;
  sizes.reserve(tensors.size());
  for (const auto& [name, t] : tensors)
    sizes.emplace_back(name, static_cast<uint64_t>(t.numel()) * t.element_size());
  return plan_shards(sizes, max_shard_size, format);
}

bool is_hf_export_file_name(const std::string& name) {
  return name == kHfSingleFileName || name == kHfTorchSaveFileName || is_index_file_name(name) ||
         is_numbered_shard_name(name, "model-", ".safetensors") ||
         is_numbered_shard_name(name, "pytorch_model-", ".bin");
}

HfExport write_hf_export(FileSystem& fs, const std::string& dir, WeightsFormat format,
                         const NamedTensors& tensors, uint64_t max_shard_size,
                         const SafetensorsMetadata& metadata) {
  HfExport out;
  out.plan = plan_shards(tensors, max_shard_size, format);
  fs.make_dirs(dir);
  std::set<std::string> ours;
  for (const auto& shard : out.plan.shards) ours.insert(shard.file);
  // The old indexes go first, even when this export writes one again: until the new index is
  // written, shards of the same names are being replaced and it would describe a mix.
  std::vector<std::string> stale;
  for (const auto& name : fs.list_dir(dir)) {
    if (!is_hf_export_file_name(name)) continue;
    if (is_index_file_name(name))
      stale.insert(stale.begin(), name);
    else if (!ours.count(name))
      stale.push_back(name);
  }
  for (const auto& name : stale)
    if (fs.remove(join_path(dir, name))) out.removed.push_back(name);

  std::unordered_map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : tensors) by_name.emplace(name, &t);
  for (const auto& shard : out.plan.shards) {
    NamedTensors part;
    part.reserve(shard.names.size());
    for (const auto& name : shard.names) part.emplace_back(name, *by_name.at(name));
    write_weights(fs, join_path(dir, shard.file), format, part, metadata);
  }
  // Last: its presence says every shard above is in place (write_file_atomic syncs the folder,
  // which also makes the removals above durable).
  if (out.plan.sharded())
    fs.write_file_atomic(join_path(dir, hf_index_file_name(format)), out.plan.index_json());
  return out;
}

}  // namespace checkpoint
}  // namespace deepspeed
