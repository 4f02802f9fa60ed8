// Conversions of single JSON values to typed values, accepting the spellings real configs use.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "config/json_reader.h"
#include "deepspeed/errors.h"

namespace deepspeed::config {
namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// A number written as a string ("5e8", "0.01"); nullopt when the whole string is not a number.
std::optional<double> number_in_string(const std::string& text) {
  std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(d)) return std::nullopt;
  return d;
}

// An exact integer written as a string of digits; avoids double rounding above 2^53.
std::optional<int64_t> integer_in_string(const std::string& text) {
  std::string s = trim(text);
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// 2^63 as a double: the first value that no longer fits int64.
constexpr double kTwoPow63 = 9223372036854775808.0;

std::optional<int64_t> integral_double(double d) {
  if (!std::isfinite(d) || std::floor(d) != d || d < -kTwoPow63 || d >= kTwoPow63) {
    return std::nullopt;
  }
  return static_cast<int64_t>(d);
}

const char* kIntegerExpected = "an integer (e.g. 500000000, 5e8 or \"5e8\")";
const char* kNumberExpected = "a number (e.g. 0.001, 1e-3 or \"1e-3\")";

std::string format_number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

std::string join_path(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

std::string describe(const json& value) {
  std::string s = value.dump();
  constexpr size_t kMax = 80;
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

void fail(const std::string& path, const json& value, const std::string& expected) {
  throw ConfigError("config key '" + path + "' has value " + describe(value) + "; expected " +
                    expected);
}

int64_t to_int64(const json& value, const std::string& path) {
  if (value.is_number_integer() && !value.is_number_unsigned()) return value.get<int64_t>();
  if (value.is_number_unsigned()) {
    uint64_t u = value.get<uint64_t>();
    if (u <= static_cast<uint64_t>(INT64_MAX)) return static_cast<int64_t>(u);
    fail(path, value, "an integer that fits in 64 bits");
  }
  std::optional<double> d;
  if (value.is_number_float()) d = value.get<double>();
  if (value.is_string()) {
    if (auto exact = integer_in_string(value.get<std::string>())) return *exact;
    d = number_in_string(value.get<std::string>());
  }
  if (d) {
    if (auto i = integral_double(*d)) return *i;
  }
  fail(path, value, kIntegerExpected);
}

double to_double(const json& value, const std::string& path) {
  if (value.is_number()) return value.get<double>();
  if (value.is_string()) {
    if (auto d = number_in_string(value.get<std::string>())) return *d;
  }
  fail(path, value, kNumberExpected);
}

// The integers 1 and 0 too: DeepSpeed's plain-dict blocks test a value's truth (1 is on) and its
// pydantic blocks take 0 and 1 as booleans. Any other number (2, 0.5) is more likely a value
// written under the wrong key, so it stays an error.
std::optional<bool> boolean_value(const json& value) {
  if (value.is_boolean()) return value.get<bool>();
  if (value.is_number_integer()) {
    if (value == 1) return true;
    if (value == 0) return false;
  }
  if (value.is_string()) {
    std::string s = ascii_lower(trim(value.get<std::string>()));
    if (s == "true") return true;
    if (s == "false") return false;
  }
  return std::nullopt;
}

const char* const kBooleanExpected =
    "a boolean (true, false, \"true\" or \"false\" in any case, 1 or 0)";

bool to_bool(const json& value, const std::string& path) {
  if (auto b = boolean_value(value)) return *b;
  fail(path, value, kBooleanExpected);
}

std::string to_string(const json& value, const std::string& path) {
  if (value.is_string()) return value.get<std::string>();
  fail(path, value, "a string");
}

void require_at_least(const std::string& path, double value, double min) {
  if (value < min) fail(path, value, "a value >= " + format_number(min));
}

void require_in_range(const std::string& path, double value, double min, double max) {
  if (value < min || value > max) {
    fail(path, value, "a value in [" + format_number(min) + ", " + format_number(max) + "]");
  }
}

void require_positive(const std::string& path, double value) {
  if (!(value > 0)) fail(path, value, "a value > 0");
}

}  // namespace deepspeed::config
