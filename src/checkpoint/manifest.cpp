#include "checkpoint/manifest.h"

#include <algorithm>

#include "checkpoint/checksum.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace checkpoint {
namespace {

constexpr const char* kFormat = "deepspeed_cpp.manifest";
constexpr int kVersion = 1;
constexpr size_t kChunkBytes = size_t(4) << 20;

[[noreturn]] void bad_manifest(const std::string& source, const std::string& what) {
  throw CheckpointError("manifest '" + source + "': " + what);
}

// A manifest read from disk is input: a name must not reach outside the tag folder.
bool safe_relative_name(const std::string& name) {
  if (name.empty() || name.front() == '/') return false;
  size_t start = 0;
  while (start <= name.size()) {
    const size_t slash = std::min(name.find('/', start), name.size());
    const std::string part = name.substr(start, slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = slash + 1;
  }
  return true;
}

const nlohmann::json& member(const nlohmann::json& j, const char* key, const std::string& source,
                             const std::string& where) {
  if (!j.is_object() || !j.contains(key)) bad_manifest(source, where + "missing key \"" + key + "\"");
  return j.at(key);
}

ManifestEntry parse_entry(const nlohmann::json& j, const std::string& name, const std::string& source) {
  const std::string where = "file \"" + name + "\": ";
  const auto& bytes = member(j, "bytes", source, where);
  const auto& checksum = member(j, "checksum", source, where);
  if (!bytes.is_number_unsigned()) bad_manifest(source, where + "\"bytes\" must be a non-negative integer, got " + bytes.dump());
  if (!checksum.is_string()) bad_manifest(source, where + "\"checksum\" must be a string, got " + checksum.dump());
  return ManifestEntry{bytes.get<uint64_t>(), checksum.get<std::string>()};
}

}  // namespace

nlohmann::json Manifest::to_json() const {
  nlohmann::json j_files = nlohmann::json::object();
  for (const auto& [name, e] : files) j_files[name] = {{"bytes", e.bytes}, {"checksum", e.checksum}};
  return {{"format", kFormat},
          {"version", kVersion},
          {"checksum_algorithm", kChecksumAlgorithm},
          {"files", j_files},
          {"metadata", metadata}};
}

Manifest Manifest::from_json(const nlohmann::json& j, const std::string& source) {
  const auto& format = member(j, "format", source, "");
  if (format != kFormat) bad_manifest(source, "\"format\" is " + format.dump() + ", expected \"" + kFormat + "\"");
  const auto& version = member(j, "version", source, "");
  if (version != kVersion) {
    bad_manifest(source, "\"version\" " + version.dump() + " is not supported (this library reads " +
                             std::to_string(kVersion) + ")");
  }
  const auto& algo = member(j, "checksum_algorithm", source, "");
  if (algo != kChecksumAlgorithm) {
    bad_manifest(source, "\"checksum_algorithm\" " + algo.dump() + " is not supported (expected \"" +
                             kChecksumAlgorithm + "\")");
  }
  const auto& j_files = member(j, "files", source, "");
  if (!j_files.is_object()) bad_manifest(source, "\"files\" must be an object");
  Manifest m;
  for (const auto& [name, entry] : j_files.items()) {
    if (!safe_relative_name(name)) bad_manifest(source, "file name \"" + name + "\" is not a plain relative path");
    m.files[name] = parse_entry(entry, name, source);
  }
  if (j.contains("metadata")) {
    if (!j.at("metadata").is_object()) bad_manifest(source, "\"metadata\" must be an object");
    m.metadata = j.at("metadata");
  }
  return m;
}

ManifestEntry describe_file(FileSystem& fs, const std::string& path) {
  auto file = fs.open_file(path);
  const uint64_t size = file->size();
  std::string buf(std::min<uint64_t>(size, kChunkBytes), '\0');
  uint32_t crc = 0;
  for (uint64_t off = 0; off < size;) {
    const size_t n = size_t(std::min<uint64_t>(buf.size(), size - off));
    file->read_at(off, &buf[0], n);
    crc = crc32c_extend(crc, buf.data(), n);
    off += n;
  }
  return ManifestEntry{size, to_hex32(crc)};
}

Manifest make_manifest(FileSystem& fs, const std::string& dir, const std::vector<std::string>& names,
                       nlohmann::json metadata) {
  Manifest m;
  for (const auto& name : names) m.files[name] = describe_file(fs, join_path(dir, name));
  m.metadata = std::move(metadata);
  return m;
}

void write_manifest(FileSystem& fs, const std::string& dir, const Manifest& manifest) {
  fs.write_file_atomic(join_path(dir, kManifestFileName), manifest.to_json().dump(2) + "\n");
}

Manifest read_manifest(FileSystem& fs, const std::string& dir) {
  const std::string path = join_path(dir, kManifestFileName);
  if (!fs.exists(path)) {
    throw CheckpointError("manifest '" + path + "' is missing: the checkpoint was not completely written");
  }
  std::string text;
  try {
    text = fs.read_file(path);
  } catch (const IOError& e) {
    throw CheckpointError("manifest '" + path + "' cannot be read: " + e.what());
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    bad_manifest(path, std::string("not valid JSON: ") + e.what());
  }
  return Manifest::from_json(j, path);
}

void verify_files(FileSystem& fs, const std::string& dir, const Manifest& manifest) {
  for (const auto& [name, want] : manifest.files) {
    const std::string path = join_path(dir, name);
    const std::string prefix = "checkpoint file '" + path + "' ";
    if (!fs.exists(path)) throw CheckpointError(prefix + "is missing (listed in the manifest)");
    ManifestEntry got;
    try {
      got = describe_file(fs, path);
    } catch (const IOError& e) {
      throw CheckpointError(prefix + "cannot be read: " + e.what());
    }
    if (got.bytes < want.bytes) {
      throw CheckpointError(prefix + "is truncated: " + std::to_string(got.bytes) + " of " +
                            std::to_string(want.bytes) + " bytes");
    }
    if (got.bytes > want.bytes) {
      throw CheckpointError(prefix + "has " + std::to_string(got.bytes) + " bytes, expected " +
                            std::to_string(want.bytes));
    }
    if (got.checksum != want.checksum) {
      throw CheckpointError(prefix + "is corrupted: " + kChecksumAlgorithm + " " + got.checksum +
                            ", expected " + want.checksum);
    }
  }
}

void verify_files(const std::string& dir, const Manifest& manifest) {
  verify_files(posix_file_system(), dir, manifest);
}

}  // namespace checkpoint
}  // namespace deepspeed
