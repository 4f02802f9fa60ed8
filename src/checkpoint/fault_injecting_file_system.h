// A FileSystem wrapper for tests: fails the K-th call of an operation with a chosen errno, or
// simulates the process being killed at that point. Counts run from construction or reset().
//
//   FaultInjectingFileSystem fs(posix_file_system());
//   fs.fail_at(FsOp::kWrite, 1, ENOSPC);   // the first append writes half its bytes, then ENOSPC
//   fs.crash_at(FsOp::kRename, 1);         // the first rename throws SimulatedCrash, does nothing
//
// A failed kWrite first writes half of the bytes through (a disk filling up mid-write); every
// other failed or crashed operation does nothing to the underlying file system.
//
// simulate_power_loss() then rewinds the disk to what a power cut would leave (LevelDB's
// FaultInjectionTestEnv, simplified): files created through this wrapper keep only the bytes an
// fsync covered, and renames not followed by an fsync of their directory are undone (the old
// target comes back). Meant for small test files: undoing a rename keeps the old bytes in memory.
// Thread-safety: all methods may be called concurrently.
#pragma once
#include <array>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "checkpoint/file_system.h"

namespace deepspeed {
namespace checkpoint {

enum class FsOp { kCreate, kWrite, kSync, kClose, kRename, kSyncDir, kOpen, kRead, kRemove, kMakeDirs };
constexpr int kFsOpCount = 10;
const char* fs_op_name(FsOp op);

// "The process died here." Deliberately not a deepspeed::Error, so no library code catches it and
// cleans up: the test then sees what a killed process leaves on disk.
class SimulatedCrash : public std::exception {
 public:
  explicit SimulatedCrash(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

class FaultInjectingFileSystem : public FileSystem {
 public:
  explicit FaultInjectingFileSystem(FileSystem& base) : base_(base) {}

  // REQUIRES: nth >= 1. The nth call of op (counting all earlier calls) throws IOError(err).
  void fail_at(FsOp op, int nth, int err);
  // REQUIRES: nth >= 1. The nth call of op throws SimulatedCrash before touching anything.
  void crash_at(FsOp op, int nth);
  // Forgets all faults and zeroes the counters.
  void reset();
  // Calls of op seen so far (including the failed one).
  int calls(FsOp op) const;
  // Rewinds unsynced data and renames (see above) and forgets them.
  void simulate_power_loss();

  std::unique_ptr<WritableFile> create_file(const std::string& path) override;
  std::unique_ptr<ReadableFile> open_file(const std::string& path) override;
  void rename(const std::string& from, const std::string& to) override;
  void sync_dir(const std::string& dir) override;
  bool exists(const std::string& path) override { return base_.exists(path); }
  std::vector<std::string> list_dir(const std::string& dir) override { return base_.list_dir(dir); }
  void make_dirs(const std::string& path) override;
  bool remove(const std::string& path) override;

  // Counts one call of op on path; throws if a fault is armed for it. Returns the errno to fail
  // with after a partial effect (kWrite only), else 0. Used by the wrapped file objects.
  int check(FsOp op, const std::string& path);
  // Called by the wrapped file after a successful fsync: `bytes` are now durable.
  void note_synced(const std::string& path, uint64_t bytes);

 private:
  struct Fault {
    int nth = 0;  // 0: none
    int err = 0;
    bool crash = false;
  };
  struct PendingRename {
    std::string from, to;
    bool had_old = false;
    std::string old_bytes;
  };
  void restore(const std::string& path, const std::string& bytes);

  FileSystem& base_;
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> synced_;  // files created here -> bytes an fsync covered
  std::vector<PendingRename> pending_renames_;
  std::array<int, kFsOpCount> calls_{};
  std::array<Fault, kFsOpCount> faults_{};
};

}  // namespace checkpoint
}  // namespace deepspeed
