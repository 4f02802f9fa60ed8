// FileSystem over POSIX calls. EINTR is retried; every other failure becomes an IOError naming
// the path and errno.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "checkpoint/file_system.h"

namespace deepspeed {
namespace checkpoint {
namespace {

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void append(const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw_io_error("write", path_, errno);
      // A regular file that accepts nothing is out of space in all but name.
      if (w == 0) throw_io_error("write (no progress)", path_, ENOSPC);
      p += w;
      n -= size_t(w);
    }
  }

  void sync() override {
    if (::fsync(fd_) != 0) throw_io_error("fsync", path_, errno);
  }

  void close() override {
    if (fd_ < 0) return;
    const int fd = fd_;
    fd_ = -1;
    // Not retried on EINTR: Linux has released the descriptor either way.
    if (::close(fd) != 0 && errno != EINTR) throw_io_error("close", path_, errno);
  }

 private:
  std::string path_;
  int fd_;
};

class PosixReadableFile : public ReadableFile {
 public:
  PosixReadableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixReadableFile() override { ::close(fd_); }

  uint64_t size() override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) throw_io_error("stat", path_, errno);
    return uint64_t(st.st_size);
  }

  void read_at(uint64_t offset, void* dst, size_t n) override {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, p, std::min<size_t>(n, size_t(1) << 30), off_t(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw_io_error("read", path_, errno);
      if (r == 0) {
        throw_io_error("read (short read: file ends at " + std::to_string(offset) + ", " +
                           std::to_string(n) + " more bytes wanted)",
                       path_, EIO);
      }
      p += r;
      n -= size_t(r);
      offset += uint64_t(r);
    }
  }

 private:
  std::string path_;
  int fd_;
};

int open_retrying(const std::string& path, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

class PosixFileSystem : public FileSystem {
 public:
  std::unique_ptr<WritableFile> create_file(const std::string& path) override {
    const int fd = open_retrying(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) throw_io_error("create", path, errno);
    return std::make_unique<PosixWritableFile>(path, fd);
  }

  std::unique_ptr<ReadableFile> open_file(const std::string& path) override {
    const int fd = open_retrying(path, O_RDONLY);
    if (fd < 0) throw_io_error("open", path, errno);
    return std::make_unique<PosixReadableFile>(path, fd);
  }

  void rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) throw_io_error("rename to '" + to + "' from", from, errno);
  }

  void sync_dir(const std::string& dir) override {
    const int fd = open_retrying(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) throw_io_error("open directory", dir, errno);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) throw_io_error("fsync directory", dir, err);
  }

  bool exists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }

  std::vector<std::string> list_dir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) throw_io_error("list directory", dir, errno);
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }

  void make_dirs(const std::string& path) override {
    size_t pos = 0;
    do {
      pos = path.find('/', pos + 1);
      const std::string prefix = path.substr(0, pos);
      if (prefix.empty() || ::mkdir(prefix.c_str(), 0755) == 0) continue;
      const int err = errno;
      struct stat st;
      if (err == EEXIST && ::stat(prefix.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
      throw_io_error("create directory", prefix, err == EEXIST ? ENOTDIR : err);
    } while (pos != std::string::npos);
  }

  bool remove(const std::string& path) override {
    if (::remove(path.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    throw_io_error("remove", path, errno);
  }
};

}  // namespace

FileSystem& posix_file_system() {
  static PosixFileSystem fs;
  return fs;
}

}  // namespace checkpoint
}  // namespace deepspeed
