// load_config: read ds_config.json from disk. Like DeepSpeed (which reads with hjson), comments
// are allowed and duplicate keys are rejected; errors name the file and the position.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "config/blocks.h"
#include "deepspeed/config.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace {

using nlohmann::json;

// Finds the first key written twice in one object (nlohmann would silently keep the last one).
class DuplicateKeyFinder : public nlohmann::json_sax<json> {
 public:
  std::string duplicate;  // key path, empty when none

  bool key(string_t& k) override {
    Frame& f = frames_.back();
    if (!f.keys.insert(k).second) {
      duplicate = config::join_path(f.path, k);
      return false;
    }
    last_key_ = k;
    return true;
  }
  bool start_object(std::size_t) override { return push(); }
  bool end_object() override { return pop(); }
  bool start_array(std::size_t) override { return push(); }
  bool end_array() override { return pop(); }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;  // syntax errors are reported by the DOM parse
  }

 private:
  struct Frame {
    std::string path;
    std::set<std::string> keys;
  };
  bool push() {
    std::string path = frames_.empty() ? "" : config::join_path(frames_.back().path, last_key_);
    frames_.push_back({path, {}});
    last_key_ = "[]";  // members of an array have no key
    return true;
  }
  bool pop() {
    frames_.pop_back();
    return true;
  }
  std::vector<Frame> frames_;
  std::string last_key_;
};

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw ConfigError("DeepSpeed config file '" + path + "' does not exist");
  }
  if (std::filesystem::is_directory(path, ec)) {
    throw ConfigError("DeepSpeed config path '" + path + "' is a directory, not a JSON file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError("cannot read DeepSpeed config file '" + path + "' (permissions?)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// "line L, column C (byte B)" for a byte offset into text (1-based like editors).
std::string position(const std::string& text, size_t byte) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column) + " (byte " +
         std::to_string(byte) + ")";
}

json parse_text(const std::string& text, const std::string& path) {
  json doc;
  try {
    doc = json::parse(text, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    // e.byte is one past the offending character.
    throw ConfigError("DeepSpeed config file '" + path + "' is not valid JSON at " +
                      position(text, e.byte > 0 ? e.byte - 1 : 0) + ": " + e.what());
  }
  DuplicateKeyFinder finder;
  json::sax_parse(text, &finder, json::input_format_t::json, /*strict=*/true,
                  /*ignore_comments=*/true);
  if (!finder.duplicate.empty()) {
    throw ConfigError("DeepSpeed config file '" + path + "' gives key '" + finder.duplicate +
                      "' twice; keep one");
  }
  return doc;
}

}  // namespace

Config load_config(const std::string& path, int dp_world_size, const ConfigOverrides& overrides,
                   std::vector<std::string>* warnings) {
  json doc = parse_text(read_file(path), path);
  try {
    return parse_config(doc, dp_world_size, overrides, warnings);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(e.what()) + " (in " + path + ")");
  }
}

}  // namespace deepspeed
