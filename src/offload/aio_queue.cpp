#include "offload/aio_queue.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "deepspeed/errors.h"
#include "offload/aligned_buffer.h"

namespace deepspeed::offload {

namespace {

// open(2) with O_DIRECT, or without it where the file system refuses it (tmpfs: EINVAL). -1 with
// errno set on failure.
int open_direct(const std::string& path, int flags, bool& direct) {
  int fd = ::open(path.c_str(), flags | O_DIRECT, 0600);
  direct = true;
  if (fd < 0 && errno == EINVAL) {
    // A kernel may create the file before it finds the file system cannot do O_DIRECT (tmpfs
    // before Linux 6.6): with O_EXCL that file is ours (an existing one is EEXIST), and
    // creating it again exclusively would find it there.
    if ((flags & (O_CREAT | O_EXCL)) == (O_CREAT | O_EXCL)) ::unlink(path.c_str());
    fd = ::open(path.c_str(), flags, 0600);
    direct = false;
  }
  return fd;
}

constexpr int kCreateFlags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;

}  // namespace

struct AioQueue::Ring {
  io_uring ring;
};

std::unique_ptr<DirectFile> create_swap_file(const std::string& dir, const std::string& config_key,
                                             const std::string& prefix) {
  if (dir.empty())
    throw IOError(fmt::format("{} is empty: give the directory for the swap files", config_key));
  // Made when missing, as DeepSpeed's swappers os.makedirs(exist_ok=True) theirs; each rank
  // makes it for itself (a rank finding it made by another is fine).
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  struct stat st;
  if (ec || ::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw IOError(
        fmt::format("{} '{}' is not a directory and cannot be created: {}", config_key, dir,
                    ec ? ec.message() : std::string("a file of that name is in the way")));
  static std::atomic<int> counter{0};
  // A name already taken (another job that reuses this pid and nvme_path, or a file left by an
  // older build) is skipped: O_EXCL never opens it.
  for (int tries = 0;; ++tries) {
    const std::string path = fmt::format("{}/{}.{}.{}.bin", dir, prefix, ::getpid(), counter++);
    bool direct;
    const int fd = open_direct(path, kCreateFlags, direct);
    if (fd < 0 && errno == EEXIST && tries < 1000) continue;
    if (fd < 0)
      throw IOError(fmt::format("cannot create swap file '{}' ({} '{}'): {}", path, config_key,
                                dir, std::strerror(errno)));
    auto file = std::unique_ptr<DirectFile>(new DirectFile(path, fd, direct));
    // From here on every access goes through the descriptor: without a name, the file's space
    // is the kernel's to free when it is closed, however the process ends.
    if (::unlink(path.c_str()) != 0)
      throw IOError(fmt::format("cannot unlink the new swap file '{}' ({} '{}'): {}", path,
                                config_key, dir, std::strerror(errno)));
    return file;
  }
}

std::unique_ptr<DirectFile> DirectFile::create(const std::string& path) {
  bool direct;
  const int fd = open_direct(path, kCreateFlags, direct);
  if (fd < 0)
    throw IOError(fmt::format("cannot create swap file '{}': {}", path, std::strerror(errno)));
  return std::unique_ptr<DirectFile>(new DirectFile(path, fd, direct));
}

std::unique_ptr<DirectFile> DirectFile::open_existing(const std::string& path) {
  bool direct;
  const int fd = open_direct(path, O_RDWR | O_CLOEXEC, direct);
  if (fd < 0)
    throw IOError(fmt::format("cannot open swap file '{}': {}", path, std::strerror(errno)));
  return std::unique_ptr<DirectFile>(new DirectFile(path, fd, direct));
}

DirectFile::~DirectFile() { ::close(fd_); }

void DirectFile::resize(int64_t bytes) {
  if (::ftruncate(fd_, bytes) != 0)
    throw IOError(fmt::format("cannot size swap file '{}' to {} bytes: {}", path_, bytes,
                              std::strerror(errno)));
}

int64_t DirectFile::size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0)
    throw IOError(fmt::format("cannot stat swap file '{}': {}", path_, std::strerror(errno)));
  return st.st_size;
}

AioQueue::AioQueue(AioOptions options) : options_(options), ring_(std::make_unique<Ring>()) {
  if (options_.block_size <= 0 || options_.block_size % kDirectIoAlignment != 0 ||
      options_.block_size > kMaxAioBlockSize)
    throw ConfigError(fmt::format("aio.block_size must be a positive multiple of {} bytes, at "
                                  "most {}, got {}",
                                  kDirectIoAlignment, kMaxAioBlockSize, options_.block_size));
  if (options_.queue_depth < 1)
    throw ConfigError(fmt::format("aio.queue_depth must be >= 1, got {}", options_.queue_depth));
  int rc = io_uring_queue_init(static_cast<unsigned>(options_.queue_depth), &ring_->ring, 0);
  if (rc < 0)
    throw IOError(fmt::format("io_uring_queue_init(queue_depth {}) failed: {}",
                              options_.queue_depth, std::strerror(-rc)));
}

AioQueue::~AioQueue() {
  try {
    while (in_flight_ > 0) reap_one();
  } catch (...) {
  }
  io_uring_queue_exit(&ring_->ring);
}

AioQueue::Ticket AioQueue::enqueue(DirectFile& file, int64_t offset, char* buffer, int64_t bytes,
                                   bool write) {
  const Ticket t = next_ticket_++;
  Request& r = requests_[t];
  for (int64_t done = 0; done < bytes; done += options_.block_size) {
    const int64_t n = std::min(options_.block_size, bytes - done);
    pending_.push_back({t, &file, offset + done, buffer + done, n, write});
    ++r.pieces_left;
  }
  submit_pending();
  return t;
}

AioQueue::Ticket AioQueue::read(DirectFile& file, int64_t offset, void* buffer, int64_t bytes) {
  return enqueue(file, offset, static_cast<char*>(buffer), bytes, false);
}

AioQueue::Ticket AioQueue::write(DirectFile& file, int64_t offset, const void* buffer,
                                 int64_t bytes) {
  return enqueue(file, offset, const_cast<char*>(static_cast<const char*>(buffer)), bytes, true);
}

void AioQueue::submit_pending() {
  int queued = 0;
  while (!pending_.empty() && in_flight_ < options_.queue_depth) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
    if (!sqe) break;
    size_t slot;
    if (free_slots_.empty()) {
      slot = slots_.size();
      slots_.push_back(nullptr);
    } else {
      slot = free_slots_.back();
      free_slots_.pop_back();
    }
    slots_[slot] = std::make_unique<Piece>(pending_.front());
    pending_.pop_front();
    const Piece& p = *slots_[slot];
    if (p.write)
      io_uring_prep_write(sqe, p.file->fd(), p.buffer, static_cast<unsigned>(p.bytes), p.offset);
    else
      io_uring_prep_read(sqe, p.file->fd(), p.buffer, static_cast<unsigned>(p.bytes), p.offset);
    io_uring_sqe_set_data64(sqe, slot);
    ++in_flight_;
    ++queued;
  }
  if (queued == 0) return;
  int rc = io_uring_submit(&ring_->ring);
  if (rc < 0) throw IOError(fmt::format("io_uring_submit failed: {}", std::strerror(-rc)));
}

void AioQueue::reap_one() {
  io_uring_cqe* cqe = nullptr;
  int rc = io_uring_wait_cqe(&ring_->ring, &cqe);
  if (rc < 0) throw IOError(fmt::format("io_uring_wait_cqe failed: {}", std::strerror(-rc)));
  const size_t slot = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
  const int res = cqe->res;
  io_uring_cqe_seen(&ring_->ring, cqe);
  --in_flight_;
  std::unique_ptr<Piece> piece = std::move(slots_[slot]);
  free_slots_.push_back(slot);
  Request& r = requests_[piece->ticket];
  const char* what = piece->write ? "write" : "read";
  if (res < 0 && r.error.empty()) {
    r.error = fmt::format("{} of {} bytes at offset {} of '{}' failed: {}", what, piece->bytes,
                          piece->offset, piece->file->path(), std::strerror(-res));
  } else if (res >= 0 && res != piece->bytes && r.error.empty()) {
    // O_DIRECT never returns a partial piece unless the file ended (truncated) or the disk filled.
    r.error = fmt::format("short {} at offset {} of '{}': {} of {} bytes ({})", what,
                          piece->offset, piece->file->path(), res, piece->bytes,
                          piece->write ? "disk full?" : "file truncated?");
  } else if (res > 0) {
    (piece->write ? bytes_written_ : bytes_read_) += res;
  }
  --r.pieces_left;
  submit_pending();
}

void AioQueue::wait(Ticket ticket) {
  auto it = requests_.find(ticket);
  if (it == requests_.end()) return;
  while (it->second.pieces_left > 0) {
    submit_pending();
    reap_one();
  }
  std::string error = std::move(it->second.error);
  requests_.erase(it);
  if (!error.empty()) throw IOError(error);
}

void AioQueue::wait_all() {
  std::vector<Ticket> tickets;
  for (auto& kv : requests_) tickets.push_back(kv.first);
  std::string first;
  for (Ticket t : tickets) {
    try {
      wait(t);
    } catch (const IOError& e) {
      if (first.empty()) first = e.what();
    }
  }
  if (!first.empty()) throw IOError(first);
}

}  // namespace deepspeed::offload
