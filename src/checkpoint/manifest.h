// The manifest of one checkpoint tag: every file's size and CRC32C, plus free-form metadata
// (world size, ZeRO stage, dtype, library version, ...). Written last, atomically: a tag whose
// manifest exists is complete, and verify_files proves its files are the ones that were written.
//
// JSON form (manifest.json inside the tag folder):
//   {"format": "deepspeed_cpp.manifest", "version": 1, "checksum_algorithm": "crc32c",
//    "files": {"mp_rank_00_model_states.pt": {"bytes": 4096, "checksum": "e3069283"}, ...},
//    "metadata": {"world_size": 2, "zero_stage": 1, ...}}
// File names are relative to the tag folder and may contain '/' but never ".." or a leading '/'.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/file_system.h"

namespace deepspeed {
namespace checkpoint {

struct ManifestEntry {
  uint64_t bytes = 0;
  std::string checksum;  // hex crc32c, see checksum.h
  bool operator==(const ManifestEntry& o) const { return bytes == o.bytes && checksum == o.checksum; }
};

struct Manifest {
  std::map<std::string, ManifestEntry> files;
  nlohmann::json metadata = nlohmann::json::object();

  nlohmann::json to_json() const;
  // `source` names where the JSON came from, for error messages. Throws CheckpointError on a
  // malformed manifest (missing keys, wrong types, unknown checksum algorithm, unsafe file names).
  static Manifest from_json(const nlohmann::json& j, const std::string& source);
};

constexpr const char* kManifestFileName = "manifest.json";

// Size and checksum of one file, reading it in chunks (memory stays small for large files).
ManifestEntry describe_file(FileSystem& fs, const std::string& path);
// Describes dir/<name> for each name.
Manifest make_manifest(FileSystem& fs, const std::string& dir, const std::vector<std::string>& names,
                       nlohmann::json metadata = nlohmann::json::object());

// Atomic write / parse of dir/manifest.json. read_manifest throws CheckpointError naming the file
// when it is missing or not a valid manifest.
void write_manifest(FileSystem& fs, const std::string& dir, const Manifest& manifest);
Manifest read_manifest(FileSystem& fs, const std::string& dir);

// Checks every listed file of dir against the manifest; throws CheckpointError naming the first
// bad file and what is wrong: "missing", "truncated: 1000 of 4096 bytes", "has 5000 bytes, expected
// 4096", "corrupted: crc32c 1234abcd, expected e3069283". Files not listed are ignored.
void verify_files(FileSystem& fs, const std::string& dir, const Manifest& manifest);
void verify_files(const std::string& dir, const Manifest& manifest);  // on posix_file_system()

}  // namespace checkpoint
}  // namespace deepspeed
