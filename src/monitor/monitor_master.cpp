// make_monitor(): DeepSpeed's MonitorMaster, one writer per enabled block, each in
// <output_path>/<job_name>/.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "deepspeed/errors.h"
#include "deepspeed/monitor.h"
#include "monitor/csv_writer.h"
#include "monitor/tensorboard_writer.h"

namespace deepspeed {
namespace monitor {
namespace {

// mkdir -p with POSIX calls: std::filesystem is avoided because libtorch 2.x wheels export their
// own, statically linked copy of it (pytorch issue #133437). Returns 0 or the errno.
int make_directories(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return errno;
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return errno;
  return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

// <output_path>/<job_name> (DeepSpeed: os.path.join; an empty output_path means the working
// directory), created with parents and checked writable; `key` names the block.
std::string prepare_log_dir(const MonitorConfig& m, const std::string& key) {
  std::string dir = m.output_path;
  if (!dir.empty() && dir.back() != '/') dir += '/';
  dir += m.job_name;
  const std::string where = "config key '" + key + ".output_path' (\"" + m.output_path +
                            "\", job_name \"" + m.job_name + "\"): ";
  if (const int err = make_directories(dir))
    throw ConfigError(where + "cannot create directory '" + dir + "': " + std::strerror(err));
  if (::access(dir.c_str(), W_OK) != 0)
    throw ConfigError(where + "directory '" + dir + "' is not writable: " + std::strerror(errno));
  return dir;
}

class MonitorMaster : public Monitor {
 public:
  MonitorMaster(const Config& config, bool writer) {
    if (!writer) return;
    if (config.tensorboard.enabled) {
      tensorboard_ =
          std::make_unique<TensorBoardWriter>(prepare_log_dir(config.tensorboard, "tensorboard"));
    }
    if (config.csv_monitor.enabled) {
      csv_ = std::make_unique<CsvWriter>(prepare_log_dir(config.csv_monitor, "csv_monitor"));
    }
  }

  bool enabled() const override { return tensorboard_ || csv_; }

  void write_events(const std::vector<Event>& events) override {
    for (const Event& e : events) {
      if (tensorboard_) tensorboard_->add_scalar(e.tag, e.value, e.step);
      if (csv_) csv_->add_scalar(e.tag, e.value, e.step);
    }
  }

  void flush() override {
    if (tensorboard_) tensorboard_->flush();
    if (csv_) csv_->flush();
  }

 private:
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<CsvWriter> csv_;
};

}  // namespace

std::shared_ptr<Monitor> make_monitor(const Config& config, bool writer) {
  return std::make_shared<MonitorMaster>(config, writer);
}

}  // namespace monitor
}  // namespace deepspeed
