#include "monitor/tensorboard_writer.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>

#include "monitor/append_file.h"
#include "monitor/tensorboard_event.h"
#include "monitor/tfrecord.h"

namespace deepspeed {
namespace monitor {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

std::atomic<int> files_opened{0};

}  // namespace

std::string event_file_name(int64_t unix_seconds, const std::string& host, int pid, int n) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%010lld", static_cast<long long>(unix_seconds));
  return std::string("events.out.tfevents.") + seconds + "." + host + "." + std::to_string(pid) +
         "." + std::to_string(n);
}

void TensorBoardWriter::open() {
  const double t = now_seconds();
  path_ = log_dir_ + "/" +
          event_file_name(static_cast<int64_t>(t), host_name(), static_cast<int>(::getpid()),
                          files_opened++);
  fd_ = open_for_append(path_);
  append_tfrecord(pending_, encode_file_version_event(t, /*step=*/0, "brain.Event:2"));
  flush();
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  if (fd_ < 0) open();
  append_tfrecord(pending_,
                  encode_scalar_event(now_seconds(), step, tag, static_cast<float>(value)));
}

void TensorBoardWriter::flush() {
  if (pending_.empty() || fd_ < 0) return;
  write_all(fd_, pending_, path_);
  pending_.clear();
}

TensorBoardWriter::~TensorBoardWriter() {
  try {
    flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[deepspeed] tensorboard: %s\n", e.what());
  }
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace monitor
}  // namespace deepspeed
