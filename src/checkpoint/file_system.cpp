// The composites of FileSystem (atomic write, whole-file read) and path helpers; the POSIX
// primitives are in posix_file_system.cpp.
#include "checkpoint/file_system.h"

#include <unistd.h>

#include <cctype>
#include <new>
#include <system_error>

#include <c10/util/Exception.h>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace checkpoint {

void throw_io_error(const std::string& op, const std::string& path, int err) {
  throw IOError(op + " '" + path + "': " + std::system_category().message(err) + " (errno " +
                std::to_string(err) + ")");
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

bool is_temp_file_name(const std::string& name) {
  const auto pos = name.rfind(".tmp.");
  if (pos == std::string::npos || pos + 5 == name.size()) return false;
  for (size_t i = pos + 5; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  return true;
}

void FileSystem::write_file_atomic(const std::string& path, const std::string& bytes) {
  write_file_atomic(path, [&bytes](WritableFile& f) { f.append(bytes.data(), bytes.size()); });
}

// Best effort: the caller reports the original failure, and a leftover temporary file is harmless
// (remove_stale_temp_files collects it).
static void remove_quietly(FileSystem& fs, const std::string& path) {
  try {
    fs.remove(path);
  } catch (const IOError&) {
  }
}

void FileSystem::write_file_atomic(const std::string& path,
                                   const std::function<void(WritableFile&)>& fill) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  bool renamed = false;
  auto discard_unpublished = [&] {
    if (!renamed) remove_quietly(*this, tmp);
  };
  try {
    auto file = create_file(tmp);
    fill(*file);
    file->sync();
    file->close();
    rename(tmp, path);
    renamed = true;
    sync_dir(parent_dir(path));
  } catch (const IOError& e) {
    if (renamed) {
      throw IOError("writing '" + path + "': new contents are in place but may not survive a crash: " +
                    e.what());
    }
    remove_quietly(*this, tmp);
    throw IOError("writing '" + path + "' failed, previous contents (if any) kept: " + e.what());
  } catch (const Error&) {
    // `fill` refused (e.g. a bad tensor): nothing was published.
    discard_unpublished();
    throw;
  } catch (const c10::Error&) {
    // libtorch failed inside `fill` (an out-of-memory preparing a piece): the same.
    discard_unpublished();
    throw;
  } catch (const std::bad_alloc&) {
    discard_unpublished();
    throw;
  }
  // Anything else (the tests' SimulatedCrash: "the process died here") leaves the temporary file,
  // as a killed process would; remove_stale_temp_files collects it.
}

std::string FileSystem::read_file(const std::string& path) {
  auto file = open_file(path);
  std::string bytes(file->size(), '\0');
  if (!bytes.empty()) file->read_at(0, &bytes[0], bytes.size());
  return bytes;
}

uint64_t FileSystem::file_size(const std::string& path) { return open_file(path)->size(); }

int FileSystem::remove_stale_temp_files(const std::string& dir) {
  int removed = 0;
  for (const auto& name : list_dir(dir)) {
    if (is_temp_file_name(name) && remove(join_path(dir, name))) ++removed;
  }
  return removed;
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  posix_file_system().write_file_atomic(path, bytes);
}

std::string read_file(const std::string& path) { return posix_file_system().read_file(path); }

}  // namespace checkpoint
}  // namespace deepspeed
