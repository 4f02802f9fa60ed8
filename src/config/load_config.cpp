// load_config: read ds_config.json from disk. Like DeepSpeed, the text is read as hjson
// (config/hjson_reader.h): comments, trailing or missing commas and quoteless values are
// allowed, duplicate keys are rejected; errors name the file and the position.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "config/hjson_reader.h"
#include "deepspeed/config.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace {

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

}  // namespace

Config load_config(const std::string& path, int dp_world_size, const ConfigOverrides& overrides,
                   std::vector<std::string>* warnings) {
  nlohmann::json doc = config::parse_hjson(read_file(path), path);
  try {
    return parse_config(doc, dp_world_size, overrides, warnings);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(e.what()) + " (in " + path + ")");
  }
}

}  // namespace deepspeed
