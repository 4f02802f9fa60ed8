// A TensorBoard event file writer (the scalar part of torch.utils.tensorboard.SummaryWriter):
// <log_dir>/events.out.tfevents.<seconds>.<host>.<pid>.<n>, TFRecord-framed tensorboard.Event
// messages, the first one carrying file_version "brain.Event:2".
// Records are buffered in memory and appended to the file by flush().
// Not thread-safe.
#pragma once
#include <cstdint>
#include <string>

namespace deepspeed {
namespace monitor {

class TensorBoardWriter {
 public:
  // The file is created with its file_version record (written at once) when the first scalar
  // arrives, so a process that never writes leaves no empty file (under a pipeline every stage's
  // data-parallel rank 0 has a monitor; only the last stage writes). Throws Error naming the file
  // when it cannot be created.
  explicit TensorBoardWriter(std::string log_dir) : log_dir_(std::move(log_dir)) {}
  ~TensorBoardWriter();  // flushes; errors are printed, not thrown
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event{wall_time, step, summary{value{tag, simple_value}}}; value is stored as float32,
  // as TensorBoard's simple_value is.
  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();
  // The event file's path; empty before the first scalar.
  const std::string& path() const { return path_; }

 private:
  void open();

  std::string log_dir_;
  std::string path_;
  int fd_ = -1;
  std::string pending_;  // framed records not yet written
};

// The file name TensorBoard (and torch's SummaryWriter) uses; `n` tells apart files one process
// opens in the same second.
std::string event_file_name(int64_t unix_seconds, const std::string& host, int pid, int n);

}  // namespace monitor
}  // namespace deepspeed
