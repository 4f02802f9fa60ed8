#include "checkpoint/fault_injecting_file_system.h"

#include <algorithm>

namespace deepspeed {
namespace checkpoint {
namespace {

class FaultWritableFile : public WritableFile {
 public:
  FaultWritableFile(FaultInjectingFileSystem& fs, std::string path, std::unique_ptr<WritableFile> base)
      : fs_(fs), path_(std::move(path)), base_(std::move(base)) {}

  void append(const void* data, size_t n) override {
    if (const int err = fs_.check(FsOp::kWrite, path_)) {
      base_->append(data, n / 2);
      written_ += n / 2;
      throw_io_error("write", path_, err);
    }
    base_->append(data, n);
    written_ += n;
  }
  void sync() override {
    fs_.check(FsOp::kSync, path_);
    base_->sync();
    fs_.note_synced(path_, written_);
  }
  void close() override {
    fs_.check(FsOp::kClose, path_);
    base_->close();
  }

 private:
  FaultInjectingFileSystem& fs_;
  std::string path_;
  std::unique_ptr<WritableFile> base_;
  uint64_t written_ = 0;
};

class FaultReadableFile : public ReadableFile {
 public:
  FaultReadableFile(FaultInjectingFileSystem& fs, std::string path, std::unique_ptr<ReadableFile> base)
      : fs_(fs), path_(std::move(path)), base_(std::move(base)) {}

  uint64_t size() override { return base_->size(); }
  void read_at(uint64_t offset, void* dst, size_t n) override {
    fs_.check(FsOp::kRead, path_);
    base_->read_at(offset, dst, n);
  }

 private:
  FaultInjectingFileSystem& fs_;
  std::string path_;
  std::unique_ptr<ReadableFile> base_;
};

}  // namespace

const char* fs_op_name(FsOp op) {
  static const char* names[kFsOpCount] = {"create", "write", "fsync", "close", "rename",
                                          "fsync directory", "open", "read", "remove", "make_dirs"};
  return names[static_cast<int>(op)];
}

void FaultInjectingFileSystem::fail_at(FsOp op, int nth, int err) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_[static_cast<int>(op)] = Fault{nth, err, false};
}

void FaultInjectingFileSystem::crash_at(FsOp op, int nth) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_[static_cast<int>(op)] = Fault{nth, 0, true};
}

void FaultInjectingFileSystem::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.fill(0);
  faults_.fill(Fault{});
  synced_.clear();
  pending_renames_.clear();
}

void FaultInjectingFileSystem::note_synced(const std::string& path, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  synced_[path] = bytes;
}

void FaultInjectingFileSystem::restore(const std::string& path, const std::string& bytes) {
  auto file = base_.create_file(path);
  file->append(bytes.data(), bytes.size());
  file->close();
}

void FaultInjectingFileSystem::simulate_power_loss() {
  std::lock_guard<std::mutex> lock(mu_);
  // Newest first, so a chain of renames unwinds to the oldest durable state.
  for (auto it = pending_renames_.rbegin(); it != pending_renames_.rend(); ++it) {
    if (base_.exists(it->to)) base_.rename(it->to, it->from);
    if (it->had_old) restore(it->to, it->old_bytes);
    auto moved = synced_.find(it->to);
    if (moved != synced_.end()) {
      const uint64_t bytes = moved->second;
      synced_.erase(moved);
      synced_[it->from] = bytes;
    }
  }
  pending_renames_.clear();
  for (const auto& [path, bytes] : synced_) {
    if (!base_.exists(path)) continue;
    auto file = base_.open_file(path);
    if (file->size() <= bytes) continue;
    std::string kept(bytes, '\0');
    if (bytes > 0) file->read_at(0, &kept[0], bytes);
    file.reset();
    restore(path, kept);
  }
  synced_.clear();
}

int FaultInjectingFileSystem::calls(FsOp op) const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_[static_cast<int>(op)];
}

int FaultInjectingFileSystem::check(FsOp op, const std::string& path) {
  Fault fault;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int i = static_cast<int>(op);
    if (++calls_[i] != faults_[i].nth) return 0;
    fault = faults_[i];
  }
  const std::string where = std::string(fs_op_name(op)) + " '" + path + "'";
  if (fault.crash) throw SimulatedCrash("simulated crash at " + where);
  if (op == FsOp::kWrite) return fault.err;  // the caller writes part, then throws
  throw_io_error(std::string(fs_op_name(op)) + " (injected)", path, fault.err);
}

std::unique_ptr<WritableFile> FaultInjectingFileSystem::create_file(const std::string& path) {
  check(FsOp::kCreate, path);
  {
    std::lock_guard<std::mutex> lock(mu_);
    synced_[path] = 0;
  }
  return std::make_unique<FaultWritableFile>(*this, path, base_.create_file(path));
}

std::unique_ptr<ReadableFile> FaultInjectingFileSystem::open_file(const std::string& path) {
  check(FsOp::kOpen, path);
  return std::make_unique<FaultReadableFile>(*this, path, base_.open_file(path));
}

void FaultInjectingFileSystem::rename(const std::string& from, const std::string& to) {
  check(FsOp::kRename, from);
  PendingRename pending{from, to, base_.exists(to), ""};
  if (pending.had_old) pending.old_bytes = base_.read_file(to);
  base_.rename(from, to);
  std::lock_guard<std::mutex> lock(mu_);
  pending_renames_.push_back(std::move(pending));
  auto moved = synced_.find(from);
  if (moved != synced_.end()) {
    synced_[to] = moved->second;
    synced_.erase(from);
  }
}

void FaultInjectingFileSystem::sync_dir(const std::string& dir) {
  check(FsOp::kSyncDir, dir);
  base_.sync_dir(dir);
  std::lock_guard<std::mutex> lock(mu_);
  pending_renames_.erase(std::remove_if(pending_renames_.begin(), pending_renames_.end(),
                                        [&](const PendingRename& r) { return parent_dir(r.to) == dir; }),
                         pending_renames_.end());
}

void FaultInjectingFileSystem::make_dirs(const std::string& path) {
  check(FsOp::kMakeDirs, path);
  base_.make_dirs(path);
}

bool FaultInjectingFileSystem::remove(const std::string& path) {
  check(FsOp::kRemove, path);
  return base_.remove(path);
}

}  // namespace checkpoint
}  // namespace deepspeed
