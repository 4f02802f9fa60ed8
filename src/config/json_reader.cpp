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

}  // namespace

std::string closest_key(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = std::max<size_t>(2, key.size() / 4) + 1;  // only near misses
  for (const auto& k : known) {
    size_t d = edit_distance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  return best;
}

std::string closest_key(const std::string& key, const std::set<std::string>& known) {
  return closest_key(key, std::vector<std::string>(known.begin(), known.end()));
}

size_t first_invalid_utf8(std::string_view text) {
  auto byte = [&](size_t i) { return i < text.size() ? static_cast<unsigned char>(text[i]) : 0u; };
  auto in = [](unsigned b, unsigned lo, unsigned hi) { return b >= lo && b <= hi; };
  size_t i = 0;
  while (i < text.size()) {
    unsigned b = byte(i);
    // The range the second byte must fall in narrows for E0, ED, F0 and F4 (overlong forms,
    // UTF-16 surrogates, code points past U+10FFFF); later bytes are always 80..BF.
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (b < 0x80) len = 1;
    else if (in(b, 0xC2, 0xDF)) len = 2;
    else if (b == 0xE0) len = 3, lo = 0xA0;
    else if (b == 0xED) len = 3, hi = 0x9F;
    else if (in(b, 0xE1, 0xEF)) len = 3;
    else if (b == 0xF0) len = 4, lo = 0x90;
    else if (in(b, 0xF1, 0xF3)) len = 4;
    else if (b == 0xF4) len = 4, hi = 0x8F;
    else return i;
    for (size_t k = 1; k < len; ++k) {
      if (!in(byte(i + k), k == 1 ? lo : 0x80, k == 1 ? hi : 0xBF)) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

namespace {

// `text` with each byte that is not UTF-8 written as \xNN, so that a message can show it.
std::string escape_invalid(std::string_view text) {
  std::string out;
  static const char* kHex = "0123456789ABCDEF";
  for (size_t bad; (bad = first_invalid_utf8(text)) != std::string_view::npos;) {
    out += text.substr(0, bad);
    unsigned char b = static_cast<unsigned char>(text[bad]);
    out += std::string("\\x") + kHex[b >> 4] + kHex[b & 15];
    text.remove_prefix(bad + 1);
  }
  return out + std::string(text);
}

}  // namespace

void reject_invalid_utf8(const json& doc, const std::string& path) {
  const char* kWhy = " is not valid UTF-8 (shown with \\xNN for the bad bytes); JSON holds UTF-8 "
                     "text only, and DeepSpeed reads config files as UTF-8";
  if (doc.is_string()) {
    const std::string& s = doc.get_ref<const std::string&>();
    if (first_invalid_utf8(s) != std::string_view::npos) {
      throw ConfigError("config key '" + path + "' has the string \"" + escape_invalid(s) +
                        "\", which" + kWhy);
    }
  } else if (doc.is_object()) {
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (first_invalid_utf8(it.key()) != std::string_view::npos) {
        throw ConfigError("config key '" + join_path(path, escape_invalid(it.key())) + "'" + kWhy);
      }
      reject_invalid_utf8(*it, join_path(path, it.key()));
    }
  } else if (doc.is_array()) {
    for (size_t i = 0; i < doc.size(); ++i) {
      reject_invalid_utf8(doc[i], path + "[" + std::to_string(i) + "]");
    }
  }
}

void Warnings::add(const std::string& message) {
  if (sink_) {
    sink_->push_back(message);
  } else {
    print_warning(message);
  }
}

void print_warning(const std::string& message) {
  std::cerr << "[deepspeed] warning: " << message << std::endl;
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
    std::string near = closest_key(it.key(), known_);
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
