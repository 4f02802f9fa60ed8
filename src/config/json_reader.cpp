// ObjectReader: typed getters over one JSON object, and unknown-key warnings.
#include "config/json_reader.h"

#include <algorithm>
#include <climits>
#include <iostream>

#include "deepspeed/errors.h"

namespace deepspeed::config {
namespace {

// Edit distance, to suggest the known key a misspelt one was probably meant to be.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string closest(const std::string& key, const std::set<std::string>& known) {
  std::string best;
  size_t best_d = std::max<size_t>(2, key.size() / 4) + 1;  // only near misses
  for (const auto& k : known) {
    size_t d = edit_distance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  return best;
}

}  // namespace

void Warnings::add(const std::string& message) {
  if (sink_) {
    sink_->push_back(message);
  } else {
    std::cerr << "[deepspeed] warning: " << message << std::endl;
  }
}

ObjectReader::ObjectReader(const json& obj, std::string path, Warnings& warnings)
    : obj_(obj), path_(std::move(path)), warnings_(warnings) {}

bool ObjectReader::has(const std::string& key) const {
  auto it = obj_.find(key);
  return it != obj_.end() && !it->is_null();
}

const json* ObjectReader::find(const std::string& key) {
  known_.insert(key);
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return nullptr;
  return &*it;
}

void ObjectReader::read(const std::string& key, bool& out) {
  if (const json* v = find(key)) out = to_bool(*v, path_of(key));
}

void ObjectReader::read(const std::string& key, int& out) {
  if (const json* v = find(key)) {
    int64_t i = to_int64(*v, path_of(key));
    if (i < INT_MIN || i > INT_MAX) fail(path_of(key), *v, "an integer that fits in 32 bits");
    out = static_cast<int>(i);
  }
}

void ObjectReader::read(const std::string& key, int64_t& out) {
  if (const json* v = find(key)) out = to_int64(*v, path_of(key));
}

void ObjectReader::read(const std::string& key, uint64_t& out) {
  if (const json* v = find(key)) {
    int64_t i = to_int64(*v, path_of(key));
    if (i < 0) fail(path_of(key), *v, "a non-negative integer");
    out = static_cast<uint64_t>(i);
  }
}

void ObjectReader::read(const std::string& key, double& out) {
  if (const json* v = find(key)) out = to_double(*v, path_of(key));
}

void ObjectReader::read(const std::string& key, std::string& out) {
  if (const json* v = find(key)) out = to_string(*v, path_of(key));
}

void ObjectReader::read(const std::string& key, std::optional<bool>& out) {
  if (const json* v = find(key)) out = to_bool(*v, path_of(key));
}

void ObjectReader::read(const std::string& key, std::optional<int64_t>& out) {
  if (const json* v = find(key)) out = to_int64(*v, path_of(key));
}

void ObjectReader::read_count(const std::string& key, int64_t& out) {
  if (const json* v = find(key)) {
    int64_t i = to_int64(*v, path_of(key));
    if (i < 0) fail(path_of(key), *v, "a non-negative integer");
    out = i;
  }
}

void ObjectReader::accept(const std::vector<std::string>& keys) {
  known_.insert(keys.begin(), keys.end());
}

ObjectReader ObjectReader::child(const std::string& key) {
  static const json kEmpty = json::object();
  const json* v = find(key);
  if (!v) return ObjectReader(kEmpty, path_of(key), warnings_);
  if (!v->is_object()) fail(path_of(key), *v, "a JSON object {...}");
  return ObjectReader(*v, path_of(key), warnings_);
}

void ObjectReader::finish(UnknownKeys policy) {
  std::string errors;
  for (auto it = obj_.begin(); it != obj_.end(); ++it) {
    if (known_.count(it.key())) continue;
    std::string msg = "unknown config key '" + path_of(it.key()) + "'";
    std::string near = closest(it.key(), known_);
    if (!near.empty()) msg += " (did you mean '" + path_of(near) + "'?)";
    if (policy == UnknownKeys::kWarn) {
      warnings_.add(msg + "; it is ignored");
    } else {
      errors += (errors.empty() ? "" : "; ") + msg;
    }
  }
  if (!errors.empty()) {
    throw ConfigError(errors + ". DeepSpeed rejects unknown keys inside '" + path_ +
                      "' (a strictly checked block); correct or remove them");
  }
}

}  // namespace deepspeed::config
