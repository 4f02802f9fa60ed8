// Typed reads from a config block's "params" object, with errors that name the full key path
// (e.g. "scheduler.params.total_num_steps") and a record of which keys were read, so the caller
// can report the keys nobody asked for.
//
// Accepted spellings follow config.h: numbers as 5e8 or "5e8"; booleans by the config's one rule
// (config/json_reader.h: true, "true" in any case, 1). The string "auto" is rejected with a
// message saying it must be resolved before this point.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace deepspeed::optim {

class ParamReader {
 public:
  // `params` may be null (read as an empty object); anything else but an object is a ConfigError.
  // `prefix` is the key path of the block, e.g. "optimizer.params".
  ParamReader(const nlohmann::json& params, std::string prefix);

  bool has(const std::string& key) const;
  std::string path(const std::string& key) const { return prefix_ + "." + key; }

  double get_double(const std::string& key, double def);
  std::optional<double> opt_double(const std::string& key);
  // Throws ConfigError "<path> is required <why>" when absent.
  double req_double(const std::string& key, const std::string& why);
  // An integer: 1000, 1e3 or "1000" (a number with a fractional part is an error).
  int64_t get_int(const std::string& key, int64_t def);
  std::optional<int64_t> opt_int(const std::string& key);
  int64_t req_int(const std::string& key, const std::string& why);
  bool get_bool(const std::string& key, bool def);
  std::string get_string(const std::string& key, const std::string& def);
  // A number broadcast to n entries, or a list of exactly n numbers (one per param group).
  std::vector<double> get_per_group(const std::string& key, double def, size_t n);
  // A list of exactly n numbers.
  std::vector<double> get_list(const std::string& key, std::vector<double> def, size_t n);
  // Marks a key as known without reading it (accepted and ignored).
  void accept(const std::string& key);

  // Keys present in params that no get/accept call touched, in alphabetical order.
  std::vector<std::string> unread_keys() const;
  // Every key a get/accept call asked for so far, in alphabetical order.
  std::vector<std::string> known_keys() const { return {read_.begin(), read_.end()}; }

 private:
  const nlohmann::json* find(const std::string& key);
  double to_double(const nlohmann::json& v, const std::string& key) const;

  nlohmann::json params_;
  std::string prefix_;
  std::set<std::string> read_;
};

// Throws ConfigError naming the first key of `r` nobody read, the unknown keys and the known
// ones: DeepSpeed's optimizer constructors reject unknown kwargs. `type` names the optimizer.
void reject_unread(const ParamReader& r, const std::string& type);
// Throws ConfigError "<path> = v is outside [lo, hi)" unless lo <= v < hi (hi may be infinity).
void check_range(const ParamReader& r, const std::string& key, double v, double lo, double hi);

// Reports a non-fatal configuration problem: appended to `sink` when given, else printed to stderr
// with a "[deepspeed] warning:" prefix.
void warn(std::vector<std::string>* sink, const std::string& message);

}  // namespace deepspeed::optim
