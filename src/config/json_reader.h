// Typed access to one JSON object of ds_config.json, with errors that name the full key path and
// with tracking of which keys were read so that the rest can be reported as unknown.
//
// Value forms accepted everywhere (DeepSpeed configs are hand-written and often generated):
//   integers: 500000000, 5e8, 5.0e8 (a double with no fraction), "5e8", "500000000";
//   reals:    1, 1.0, 1e-3, "1e-3";
//   booleans: true/false, "true"/"false" (any case), the integers 1/0;
//   null:     the key keeps its default, as if it were absent.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>
#include "util/ascii.h"

namespace deepspeed::config {

using json = nlohmann::json;

// Where warnings go: the caller's vector if given, else stderr (print_warning).
class Warnings {
 public:
  explicit Warnings(std::vector<std::string>* sink) : sink_(sink) {}
  void add(const std::string& message);

 private:
  std::vector<std::string>* sink_;
};

// One warning on stderr as "[deepspeed] warning: <message>". initialize() collects the config's
// warnings and prints them on global rank 0 only (DeepSpeed logs config messages there).
void print_warning(const std::string& message);

// "a.b" from prefix "a" and key "b"; just "b" at the top level.
std::string join_path(const std::string& prefix, const std::string& key);

// The value as compact JSON, cut short if long, for error messages.
std::string describe(const json& value);

// The known key a misspelt `key` was probably meant to be (a near miss by edit distance), or ""
// when none is close. For "did you mean" in unknown-key messages.
std::string closest_key(const std::string& key, const std::vector<std::string>& known);
std::string closest_key(const std::string& key, const std::set<std::string>& known);

// The offset of the first byte of `text` that does not belong to well-formed UTF-8 (RFC 3629:
// no overlong forms, no encoded surrogates, nothing past U+10FFFF), or npos when all of it is.
size_t first_invalid_utf8(std::string_view text);
// Throws ConfigError naming the key path of the first key or string in `doc` that is not UTF-8.
// JSON holds UTF-8 text only: nlohmann refuses to write such a string (type_error 316), so it
// would fail later, when an error message or a checkpoint's metadata dumps the config.
void reject_invalid_utf8(const json& doc, const std::string& path = "");

// Throws ConfigError: "config key '<path>' has value <v>; expected <expected>".
[[noreturn]] void fail(const std::string& path, const json& value, const std::string& expected);

// The boolean a value stands for by the forms above; nullopt for anything else. Shared with the
// optimizer's ParamReader, so every boolean of the config is read by one rule.
std::optional<bool> boolean_value(const json& value);
// What boolean_value accepts, for "expected ..." in errors.
extern const char* const kBooleanExpected;

// Conversions of one value; `path` names the key in errors.
int64_t to_int64(const json& value, const std::string& path);
double to_double(const json& value, const std::string& path);
bool to_bool(const json& value, const std::string& path);
std::string to_string(const json& value, const std::string& path);

// Range checks after reading; `path` names the key in errors.
void require_at_least(const std::string& path, double value, double min);
void require_in_range(const std::string& path, double value, double min, double max);
void require_positive(const std::string& path, double value);

// What finish() does with keys no reader named.
enum class UnknownKeys {
  kWarn,   // DeepSpeed's plain-dict blocks ignore them; we warn
  kError,  // DeepSpeed's pydantic blocks reject them; so do we
};

// Reads one JSON object. Each read() leaves `out` unchanged when the key is absent or null.
// finish() warns about every key that no read/accept/find call named.
class ObjectReader {
 public:
  // REQUIRES: obj is a JSON object and outlives the reader. path "" is the document root.
  ObjectReader(const json& obj, std::string path, Warnings& warnings);

  const std::string& path() const { return path_; }
  std::string path_of(const std::string& key) const { return join_path(path_, key); }
  Warnings& warnings() { return warnings_; }

  // True when the key is present with a non-null value. Does not mark it known.
  bool has(const std::string& key) const;
  // The value (nullptr when absent or null); marks the key known.
  const json* find(const std::string& key);

  void read(const std::string& key, bool& out);
  void read(const std::string& key, int& out);
  void read(const std::string& key, int64_t& out);
  void read(const std::string& key, uint64_t& out);
  void read(const std::string& key, double& out);
  void read(const std::string& key, std::string& out);
  void read(const std::string& key, std::optional<bool>& out);
  void read(const std::string& key, std::optional<int64_t>& out);

  // Reads a non-negative integer (sizes, counts, thresholds).
  void read_count(const std::string& key, int64_t& out);

  // Known keys whose values live only in Config::raw.
  void accept(const std::vector<std::string>& keys);

  // The object under `key` (an empty object when absent or null); error if not an object.
  ObjectReader child(const std::string& key);

  // Reports each key no read/accept/find call named, with a close known key if any: as a
  // warning ("unknown config key '<path>' ...; it is ignored"), or, for the blocks DeepSpeed
  // models strictly (pydantic extra="forbid"), as one ConfigError listing them all.
  void finish(UnknownKeys policy = UnknownKeys::kWarn);

 private:
  const json& obj_;
  std::string path_;
  Warnings& warnings_;
  std::set<std::string> known_;
};

}  // namespace deepspeed::config
