#include "checkpoint/tag_replacement.h"

#include "checkpoint/manifest.h"
#include "deepspeed/errors.h"
#include "util/text.h"

namespace deepspeed {
namespace checkpoint {
namespace {

constexpr const char* kReplacingSuffix = ".replacing";
constexpr const char* kReplacedSuffix = ".replaced";

}  // namespace

std::string replacing_dir(const std::string& tag_dir) { return tag_dir + kReplacingSuffix; }
std::string replaced_dir(const std::string& tag_dir) { return tag_dir + kReplacedSuffix; }

bool is_replacement_name(const std::string& tag) {
  return ends_with(tag, kReplacingSuffix) || ends_with(tag, kReplacedSuffix);
}

bool holds_complete_checkpoint(FileSystem& fs, const std::string& tag_dir) {
  return fs.exists(join_path(tag_dir, kManifestFileName));
}

bool remove_checkpoint_folder(FileSystem& fs, const std::string& dir) {
  if (!fs.exists(dir)) return false;
  for (const auto& name : fs.list_dir(dir)) {
    const std::string path = join_path(dir, name);
    try {
      fs.remove(path);
    } catch (const IOError&) {
      // Not a file nor an empty folder: a folder a user put there.
      if (!remove_checkpoint_folder(fs, path)) throw;
    }
  }
  fs.remove(dir);
  return true;
}

namespace {

// A file the save writes itself (module, optimizer and layer files, the manifest, a temporary
// file); anything else in a tag folder was put there by someone else.
bool written_by_the_save(const std::string& name) {
  return name == kManifestFileName || is_temp_file_name(name) ||
         (ends_with(name, ".safetensors") && name.find("_states") != std::string::npos);
}

// What a user kept in the tag (a tokenizer, notes) moves into the new save, as an in-place
// re-save (DeepSpeed's) would have left it.
void carry_over_foreign_entries(FileSystem& fs, const std::string& from, const std::string& to) {
  bool moved = false;
  for (const auto& name : fs.list_dir(from)) {
    if (written_by_the_save(name) || fs.exists(join_path(to, name))) continue;
    fs.rename(join_path(from, name), join_path(to, name));
    moved = true;
  }
  if (!moved) return;
  fs.sync_dir(to);
  fs.sync_dir(from);
}

}  // namespace

void finish_interrupted_replacement(FileSystem& fs, const std::string& tag_dir) {
  const std::string parent = parent_dir(tag_dir);
  const std::string fresh = replacing_dir(tag_dir);
  if (!fs.exists(tag_dir) && holds_complete_checkpoint(fs, fresh)) {
    fs.rename(fresh, tag_dir);  // the dying save had removed the old copy from the tag already
    fs.sync_dir(parent);
  }
  // A save that died after moving a user's files into its replacement hands them back.
  if (fs.exists(fresh) && fs.exists(tag_dir)) carry_over_foreign_entries(fs, fresh, tag_dir);
  const bool removed_fresh = remove_checkpoint_folder(fs, fresh);
  const bool removed_old = remove_checkpoint_folder(fs, replaced_dir(tag_dir));
  if (removed_fresh || removed_old) fs.sync_dir(parent);
}

void swap_in_replacement(FileSystem& fs, const std::string& tag_dir) {
  const std::string parent = parent_dir(tag_dir);
  const std::string fresh = replacing_dir(tag_dir);
  const std::string old = replaced_dir(tag_dir);
  carry_over_foreign_entries(fs, tag_dir, fresh);
  fs.rename(tag_dir, old);
  try {
    fs.rename(fresh, tag_dir);
  } catch (const IOError&) {
    fs.rename(old, tag_dir);  // put the previous checkpoint back under its tag
    throw;
  }
  fs.sync_dir(parent);
  try {
    remove_checkpoint_folder(fs, old);
  } catch (const IOError&) {
    // The new copy is in place; the old one is collected by the next save of this tag.
  }
}

std::string tag_dir_to_read(FileSystem& fs, const std::string& tag_dir) {
  if (fs.exists(tag_dir)) return tag_dir;
  const std::string fresh = replacing_dir(tag_dir);
  return holds_complete_checkpoint(fs, fresh) ? fresh : tag_dir;
}

}  // namespace checkpoint
}  // namespace deepspeed
