// The file layer every checkpoint byte goes through (LevelDB's Env, narrowed): a real POSIX
// implementation, and an interface tests wrap to fail or "kill" at chosen points
// (fault_injecting_file_system.h).
//
// Crash safety rests on one composite, write_file_atomic: readers only ever see the old file or the
// complete new one, because the new bytes reach the disk (fsync) under a temporary name before the
// rename publishes them, and the directory is fsynced so the rename itself survives a power cut.
//
// Thread-safety: PosixFileSystem is stateless and safe to share. Concurrent write_file_atomic calls
// of one process must target different paths (the temporary name is `<path>.tmp.<pid>`).
// Every failure throws deepspeed::IOError naming the path and the errno text.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace deepspeed {
namespace checkpoint {

// A file being written. The destructor closes without reporting errors; call close() to see them.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Writes all n bytes (retrying short writes) or throws IOError.
  virtual void append(const void* data, size_t n) = 0;
  virtual void sync() = 0;   // fsync: data and size are on the device when it returns
  virtual void close() = 0;  // idempotent
};

// A file opened for positional reads.
class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  virtual uint64_t size() = 0;
  // Reads exactly n bytes at offset; a file that ends first is an IOError ("short read").
  virtual void read_at(uint64_t offset, void* dst, size_t n) = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // ---- primitives (what an implementation or a fault injector overrides) ----
  // Creates or truncates path for writing.
  virtual std::unique_ptr<WritableFile> create_file(const std::string& path) = 0;
  virtual std::unique_ptr<ReadableFile> open_file(const std::string& path) = 0;
  // Atomically replaces `to` by `from` (same file system).
  virtual void rename(const std::string& from, const std::string& to) = 0;
  // fsync of a directory: makes creations and renames inside it durable.
  virtual void sync_dir(const std::string& dir) = 0;
  virtual bool exists(const std::string& path) = 0;
  // Entry names (not paths) of dir, sorted, without "." and "..".
  virtual std::vector<std::string> list_dir(const std::string& dir) = 0;
  // mkdir -p; existing directories are fine.
  virtual void make_dirs(const std::string& path) = 0;
  // Removes a file or an empty directory; returns false if nothing was there.
  virtual bool remove(const std::string& path) = 0;

  // ---- composites, built on the primitives so injected faults reach them ----
  // Writes `<path>.tmp.<pid>`, fsyncs it, renames it over path, fsyncs the parent directory.
  // On IOError the temporary file is removed and a previous `path` is untouched (unless the
  // failure came after the rename: then the message says the new file is in place but may not
  // be durable). Any other exception (e.g. a simulated crash) leaves the temporary file behind,
  // as a killed process would; remove_stale_temp_files cleans those up.
  void write_file_atomic(const std::string& path, const std::string& bytes);
  // Streaming form: `fill` appends the content, so large files need not exist in memory twice.
  void write_file_atomic(const std::string& path, const std::function<void(WritableFile&)>& fill);
  std::string read_file(const std::string& path);
  uint64_t file_size(const std::string& path);
  // Removes `<name>.tmp.<digits>` entries of dir (left by killed writers); returns how many.
  int remove_stale_temp_files(const std::string& dir);
};

// The process-wide POSIX file system.
FileSystem& posix_file_system();

// Shorthands on posix_file_system().
void write_file_atomic(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);

// Throws IOError "<op> '<path>': <strerror> (errno N)". Used by implementations and fault injectors
// so every I/O error reads the same.
[[noreturn]] void throw_io_error(const std::string& op, const std::string& path, int err);

// "a/b/c.bin" -> "a/b"; "c.bin" -> ".".
std::string parent_dir(const std::string& path);
// Joins with exactly one '/'.
std::string join_path(const std::string& dir, const std::string& name);
// True for names of the form "<anything>.tmp.<digits>".
bool is_temp_file_name(const std::string& name);

}  // namespace checkpoint
}  // namespace deepspeed
