#include "gpt/model_flags.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "deepspeed/errors.h"
#include "deepspeed/state_dict_file.h"

namespace gpt {
namespace {

namespace fs = std::filesystem;

struct IntField {
  const char* key;  // the JSON key; the flag is "--" + key
  int64_t GPTConfig::*field;
};
constexpr IntField kInts[] = {{"n_layer", &GPTConfig::n_layer},
                              {"n_head", &GPTConfig::n_head},
                              {"n_embd", &GPTConfig::n_embd},
                              {"block_size", &GPTConfig::block_size},
                              {"vocab_size", &GPTConfig::vocab_size}};

struct BoolField {
  const char* key;
  bool GPTConfig::*field;
  const char* flag;  // sets the field to !default (--no_bias: bias false)
};
constexpr BoolField kBools[] = {{"bias", &GPTConfig::bias, "--no_bias"},
                                {"tie_embeddings", &GPTConfig::tie_embeddings, "--tie_embeddings"},
                                {"gelu_tanh", &GPTConfig::gelu_tanh, "--gelu_tanh"}};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

[[noreturn]] void write_failed(const std::string& path, const char* what) {
  throw deepspeed::CheckpointError("cannot " + std::string(what) + " '" + path +
                                   "': " + std::strerror(errno));
}

// The temporary file, fsynced, renamed over `path`: a reader sees the old file or the new one.
void write_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) write_failed(tmp, "create");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      write_failed(tmp, "write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    write_failed(tmp, "fsync");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    write_failed(path, "rename a temporary file onto");
  }
}

}  // namespace

const std::vector<std::string>& model_flag_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& f : kInts) out.push_back(std::string("--") + f.key);
    for (const auto& f : kBools) out.push_back(f.flag);
    return out;
  }();
  return names;
}

nlohmann::json model_flags_json(const GPTConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : kInts) j[f.key] = c.*f.field;
  for (const auto& f : kBools) j[f.key] = c.*f.field;
  return j;
}

std::string checkpoint_tag_dir(const std::string& load_dir, const std::string& tag) {
  std::error_code ec;
  if (ends_with(load_dir, ".safetensors") || fs::is_regular_file(load_dir, ec)) return "";
  if (tag.empty() && fs::exists(fs::path(load_dir) / "manifest.json", ec)) return load_dir;
  std::string t = tag;
  if (t.empty()) {
    const fs::path latest = fs::path(load_dir) / "latest";
    if (!fs::exists(latest, ec)) return "";
    t = trimmed(read_text(latest.string()));
    if (t.empty()) return "";
  }
  const std::string dir = (fs::path(load_dir) / t).string();
  // A re-save of the tag that died between its two renames left the new copy here (the
  // checkpoint loader reads it: docs/checkpoints.md).
  if (!fs::exists(fs::path(dir) / "manifest.json", ec) &&
      fs::exists(fs::path(dir + ".replacing") / "manifest.json", ec))
    return dir + ".replacing";
  return dir;
}

void save_model_flags(const std::string& save_dir, const GPTConfig& c) {
  const std::string dir = checkpoint_tag_dir(save_dir, "");
  if (dir.empty())
    throw deepspeed::CheckpointError("cannot write " + std::string(kModelFlagsFile) + ": '" +
                                     save_dir + "/latest' names no checkpoint");
  write_atomic(dir + "/" + kModelFlagsFile, model_flags_json(c).dump(2) + "\n");
}

std::optional<GPTConfig> read_model_flags(const std::string& tag_dir) {
  if (tag_dir.empty()) return std::nullopt;
  const std::string path = tag_dir + "/" + kModelFlagsFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw deepspeed::ConfigError("'" + path + "' is not JSON: " + e.what());
  }
  if (!j.is_object()) throw deepspeed::ConfigError("'" + path + "' is not a JSON object");
  auto fail = [&](const std::string& key, const char* why) {
    throw deepspeed::ConfigError("'" + path + "': \"" + key + "\" " + why);
  };
  const auto known = model_flags_json(GPTConfig{});
  for (const auto& [key, value] : j.items())
    if (!known.contains(key))
      fail(key, "is not a model field this gpt_generate knows (a newer gpt_train?)");
  GPTConfig c;
  for (const auto& f : kInts) {
    if (!j.contains(f.key)) fail(f.key, "is missing");
    if (!j[f.key].is_number_integer() || j[f.key].get<int64_t>() < 0)
      fail(f.key, "is not a non-negative integer");
    c.*f.field = j[f.key].get<int64_t>();
  }
  for (const auto& f : kBools) {
    if (!j.contains(f.key)) fail(f.key, "is missing");
    if (!j[f.key].is_boolean()) fail(f.key, "is not true or false");
    c.*f.field = j[f.key].get<bool>();
  }
  return c;
}

GPTConfig resolve_model_flags(const GPTConfig& parsed, const std::set<std::string>& given,
                              const std::optional<GPTConfig>& saved, const std::string& file) {
  if (!saved) return parsed;
  GPTConfig out = parsed;
  auto conflict = [&](const std::string& flag, const std::string& key, const std::string& mine,
                      const std::string& theirs) {
    throw deepspeed::ConfigError(flag + mine + " conflicts with \"" + key + "\": " + theirs +
                                 " in '" + file +
                                 "' (what gpt_train was given): leave the flag out to take "
                                 "the saved value");
  };
  for (const auto& f : kInts) {
    const std::string flag = std::string("--") + f.key;
    if (given.count(flag) && parsed.*f.field != (*saved).*f.field)
      conflict(flag, f.key, " " + std::to_string(parsed.*f.field),
               std::to_string((*saved).*f.field));
    out.*f.field = (*saved).*f.field;
  }
  for (const auto& f : kBools) {
    auto text = [](bool b) { return std::string(b ? "true" : "false"); };
    if (given.count(f.flag) && parsed.*f.field != (*saved).*f.field)
      conflict(f.flag, f.key, std::string(" (") + f.key + " " + text(parsed.*f.field) + ")",
               text((*saved).*f.field));
    out.*f.field = (*saved).*f.field;
  }
  return out;
}

std::vector<std::string> stored_tensor_names(const std::string& load_dir, const std::string& tag) {
  std::vector<std::string> names;
  std::error_code ec;
  // A weights file (safetensors, or a torch.save state dict such as pytorch_model.bin); a
  // missing one is reported by the loader.
  if (fs::is_regular_file(load_dir, ec)) return deepspeed::state_dict_file_names(load_dir);
  const std::string dir = checkpoint_tag_dir(load_dir, tag);
  const std::string manifest = dir + "/manifest.json";
  // No checkpoint: a model folder (ds_to_fp32's output), as the loader read it.
  if (dir.empty() && tag.empty() && fs::is_directory(load_dir, ec))
    return deepspeed::state_dict_file_names(load_dir);
  if (dir.empty() || !fs::exists(manifest, ec)) return names;
  // The manifest's metadata.trainable: [{"name", "numel", "shape"}, ...] (docs/checkpoints.md).
  try {
    const auto j = nlohmann::json::parse(read_text(manifest));
    for (const auto& t : j.at("metadata").at("trainable")) names.push_back(t.at("name"));
  } catch (const nlohmann::json::exception& e) {
    throw deepspeed::CheckpointError("'" + manifest + "': no metadata.trainable list: " +
                                     e.what());
  }
  return names;
}

}  // namespace gpt
