// Asynchronous direct file I/O through io_uring: the swap engine under NVMe offload
// (DeepSpeed's aio handle). A request is split into `block_size` pieces with at most
// `queue_depth` pieces in flight; completion is per request (a ticket).
//
// Files are opened with O_DIRECT so swapped states bypass the page cache (which would otherwise
// hold a second copy of what was just offloaded). A file system that refuses O_DIRECT (tmpfs) gets
// buffered I/O instead, reported once by direct() == false.
//
// Errors are never silent: a failed or short read/write throws IOError naming the file, the
// offset, the bytes expected and what the kernel returned (ENOSPC, a file truncated under the
// job...). Not thread-safe: one queue per thread that drives it.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace deepspeed::offload {

// The largest aio.block_size: one piece is one io_uring read or write, whose length is 32 bits
// and which the kernel cuts at 0x7ffff000 bytes (a larger piece would come back short).
constexpr int64_t kMaxAioBlockSize = int64_t{1} << 30;

struct AioOptions {
  int64_t block_size = 1 << 20;  // aio.block_size: bytes per submitted piece (multiple of 4096,
                                 // at most kMaxAioBlockSize)
  int queue_depth = 8;           // aio.queue_depth: pieces in flight
};

class AioQueue;
class DirectFile;

// A new swap file for direct I/O, "<dir>/<prefix>.<pid>.<n>.bin", created exclusively (O_EXCL:
// a file of that name, another job's, is never opened; the next n is tried) and unlinked at
// once: the open descriptor alone holds the data, so the kernel frees it whenever the file is
// closed, also when the process is killed or a constructor throws; nothing is ever left in
// `dir`. The name stays the file's path() for messages. `dir` is created (with its parents)
// when missing, as DeepSpeed makes its swap folders, and stays. Throws IOError naming
// `config_key`, `dir` and the OS error when it is not a directory and cannot be made one, and
// naming the path if the file cannot be created.
std::unique_ptr<DirectFile> create_swap_file(const std::string& dir, const std::string& config_key,
                                             const std::string& prefix);

// A file opened for direct I/O. REQUIRES for reads/writes: buffer, offset and length aligned to
// kDirectIoAlignment (aligned_buffer.h).
class DirectFile {
 public:
  // Creates `path`, which must not exist (O_EXCL). Throws IOError naming the path.
  static std::unique_ptr<DirectFile> create(const std::string& path);
  static std::unique_ptr<DirectFile> open_existing(const std::string& path);
  // Sets the file's length (a sparse file: disk space is taken as it is written). Throws IOError
  // naming the path and the bytes.
  void resize(int64_t bytes);
  ~DirectFile();
  const std::string& path() const { return path_; }  // (a swap file's: unlinked)
  int fd() const { return fd_; }
  bool direct() const { return direct_; }
  int64_t size() const;  // current length in bytes

 private:
  friend std::unique_ptr<DirectFile> create_swap_file(const std::string&, const std::string&,
                                                      const std::string&);
  DirectFile(std::string path, int fd, bool direct) : path_(std::move(path)), fd_(fd), direct_(direct) {}
  std::string path_;
  int fd_;
  bool direct_;
};

class AioQueue {
 public:
  using Ticket = int64_t;
  explicit AioQueue(AioOptions options);
  ~AioQueue();
  AioQueue(const AioQueue&) = delete;
  AioQueue& operator=(const AioQueue&) = delete;

  Ticket read(DirectFile& file, int64_t offset, void* buffer, int64_t bytes);
  Ticket write(DirectFile& file, int64_t offset, const void* buffer, int64_t bytes);
  // Blocks until every piece of the request is done. Throws IOError if any piece failed.
  void wait(Ticket ticket);
  void wait_all();

  int64_t bytes_read() const { return bytes_read_; }
  int64_t bytes_written() const { return bytes_written_; }

 private:
  struct Piece {
    Ticket ticket;
    DirectFile* file;
    int64_t offset;
    char* buffer;
    int64_t bytes;
    bool write;
  };
  struct Request {
    int64_t pieces_left = 0;
    std::string error;  // first failure of any piece
  };
  Ticket enqueue(DirectFile& file, int64_t offset, char* buffer, int64_t bytes, bool write);
  void submit_pending();
  void reap_one();

  AioOptions options_;
  struct Ring;
  std::unique_ptr<Ring> ring_;
  std::deque<Piece> pending_;                 // not yet submitted
  std::vector<std::unique_ptr<Piece>> slots_; // submitted, indexed by user_data
  std::vector<size_t> free_slots_;
  std::unordered_map<Ticket, Request> requests_;  // until waited for
  Ticket next_ticket_ = 0;
  int in_flight_ = 0;
  int64_t bytes_read_ = 0, bytes_written_ = 0;
};

}  // namespace deepspeed::offload
