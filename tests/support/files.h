// Files for tests: the source tree, the built programs, scratch folders that clean up after
// themselves, and whole-file bytes for corruption tests.
#pragma once
#include <string>

namespace dstest {

// The source tree: $DS_SOURCE_DIR, else the one this helper was built from.
std::string source_dir();
// The built programs: $DS_BIN_DIR (set by ctest), else build/bin.
std::string bin_dir();

// A fresh temporary folder, removed with its content by the destructor.
class TempDir {
 public:
  enum class Base {
    // $TMPDIR, else /dev/shm when usable (fsync there costs nothing, and the checkpoint tests
    // fsync thousands of files; durability itself is tested with the fault-injecting file
    // system), else /tmp.
    kFast,
    // std::filesystem::temp_directory_path() ($TMPDIR, else /tmp): a real file system, for tests
    // of direct (O_DIRECT) I/O, which tmpfs refuses, and of fsync.
    kDisk,
  };
  explicit TempDir(const std::string& prefix = "ds_ckpt_test", Base base = Base::kFast);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Bytes of a file, and overwrite helpers for corruption tests.
std::string read_bytes(const std::string& path);
void write_bytes(const std::string& path, const std::string& bytes);

}  // namespace dstest
