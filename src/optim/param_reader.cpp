#include "optim/param_reader.h"

#include <cmath>
#include <iostream>
#include <sstream>

#include "config/json_reader.h"
#include "deepspeed/errors.h"

namespace deepspeed::optim {
namespace {

[[noreturn]] void bad_type(const std::string& path, const nlohmann::json& v,
                           const std::string& want) {
  if (v.is_string() && v.get<std::string>() == "auto") {
    throw ConfigError(path + ": \"auto\" is not resolved by deepspeed.cpp here; give " + want);
  }
  throw ConfigError(path + ": expected " + want + ", got " + v.dump());
}

// Parses the whole string as a double; nullopt if any character is left over.
std::optional<double> parse_number(const std::string& s) {
  if (s.empty()) return std::nullopt;
  size_t used = 0;
  try {
    double d = std::stod(s, &used);
    if (used == s.size()) return d;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

}  // namespace

ParamReader::ParamReader(const nlohmann::json& params, std::string prefix)
    : params_(params.is_null() ? nlohmann::json::object() : params), prefix_(std::move(prefix)) {
  if (!params_.is_object()) {
    throw ConfigError(prefix_ + ": expected an object of parameters, got " + params.dump());
  }
}

bool ParamReader::has(const std::string& key) const {
  auto it = params_.find(key);
  return it != params_.end() && !it->is_null();
}

const nlohmann::json* ParamReader::find(const std::string& key) {
  read_.insert(key);
  auto it = params_.find(key);
  if (it == params_.end() || it->is_null()) return nullptr;
  return &*it;
}

double ParamReader::to_double(const nlohmann::json& v, const std::string& key) const {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    if (auto d = parse_number(v.get<std::string>())) return *d;
  }
  bad_type(path(key), v, "a number");
}

std::optional<double> ParamReader::opt_double(const std::string& key) {
  const auto* v = find(key);
  if (!v) return std::nullopt;
  return to_double(*v, key);
}

double ParamReader::get_double(const std::string& key, double def) {
  return opt_double(key).value_or(def);
}

double ParamReader::req_double(const std::string& key, const std::string& why) {
  auto v = opt_double(key);
  if (!v) throw ConfigError(path(key) + " is required " + why);
  return *v;
}

std::optional<int64_t> ParamReader::opt_int(const std::string& key) {
  const auto* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_boolean()) bad_type(path(key), *v, "an integer");
  double d = to_double(*v, key);
  if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) {
    bad_type(path(key), *v, "an integer");
  }
  return static_cast<int64_t>(d);
}

int64_t ParamReader::get_int(const std::string& key, int64_t def) {
  return opt_int(key).value_or(def);
}

int64_t ParamReader::req_int(const std::string& key, const std::string& why) {
  auto v = opt_int(key);
  if (!v) throw ConfigError(path(key) + " is required " + why);
  return *v;
}

bool ParamReader::get_bool(const std::string& key, bool def) {
  const auto* v = find(key);
  if (!v) return def;
  // The config's one rule for booleans (config/json_reader.h), so "TRUE" or 1 reads the same in
  // "optimizer.params" as in "fp16".
  if (auto b = config::boolean_value(*v)) return *b;
  bad_type(path(key), *v, config::kBooleanExpected);
}

std::string ParamReader::get_string(const std::string& key, const std::string& def) {
  const auto* v = find(key);
  if (!v) return def;
  if (!v->is_string()) bad_type(path(key), *v, "a string");
  return v->get<std::string>();
}

std::vector<double> ParamReader::get_per_group(const std::string& key, double def, size_t n) {
  const auto* v = find(key);
  if (!v) return std::vector<double>(n, def);
  if (!v->is_array()) return std::vector<double>(n, to_double(*v, key));
  // Said here, not in get_list: a fixed-size list (Adam's betas) is not one per group.
  if (v->size() != n) {
    throw ConfigError(path(key) + ": expected " + std::to_string(n) +
                      " value(s) (one per parameter group), got " + std::to_string(v->size()) +
                      ": " + v->dump());
  }
  return get_list(key, {}, n);
}

std::vector<double> ParamReader::get_list(const std::string& key, std::vector<double> def,
                                          size_t n) {
  const auto* v = find(key);
  if (!v) return def;
  if (!v->is_array()) bad_type(path(key), *v, "a list of " + std::to_string(n) + " numbers");
  if (v->size() != n) {
    throw ConfigError(path(key) + ": expected " + std::to_string(n) + " value(s), got " +
                      std::to_string(v->size()) + ": " + v->dump());
  }
  std::vector<double> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back(to_double((*v)[i], key + "[" + std::to_string(i) + "]"));
  return out;
}

void ParamReader::accept(const std::string& key) { read_.insert(key); }

std::vector<std::string> ParamReader::unread_keys() const {
  std::vector<std::string> out;
  for (const auto& item : params_.items()) {
    if (!read_.count(item.key())) out.push_back(item.key());
  }
  return out;
}

void reject_unread(const ParamReader& r, const std::string& type) {
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
    return out;
  };
  auto unread = r.unread_keys();
  if (!unread.empty()) {
    throw ConfigError(r.path(unread.front()) + " is not a parameter of " + type +
                      " (unknown keys: " + join(unread) + "; known: " + join(r.known_keys()) + ")");
  }
}

void check_range(const ParamReader& r, const std::string& key, double v, double lo, double hi) {
  if (!(v >= lo && v < hi)) {
    auto num = [](double d) {
      std::ostringstream os;
      os << d;
      return os.str();
    };
    throw ConfigError(r.path(key) + " = " + num(v) + " is outside [" + num(lo) + ", " + num(hi) +
                      ")");
  }
}

void warn(std::vector<std::string>* sink, const std::string& message) {
  if (sink) {
    sink->push_back(message);
  } else {
    std::cerr << "[deepspeed] warning: " << message << "\n";
  }
}

}  // namespace deepspeed::optim
