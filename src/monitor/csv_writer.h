// DeepSpeed's csv_monitor: one CSV file per event tag in <log_dir>, named after the tag with '/'
// and ' ' replaced by '_' (Train/Samples/train_loss -> Train_Samples_train_loss.csv), with the
// header row "step,<last component of the tag>" written the first time this process writes the
// tag, then one "step,value" row per event. Rows end in "\r\n" and values are printed as Python
// prints floats (repr), because DeepSpeed writes them with Python's csv module: the files are
// byte-for-byte what DeepSpeed writes for the same values.
// Rows are buffered and appended to the files by flush(). Not thread-safe.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>

namespace deepspeed {
namespace monitor {

class CsvWriter {
 public:
  explicit CsvWriter(std::string log_dir) : log_dir_(std::move(log_dir)) {}
  ~CsvWriter();  // flushes; errors are printed, not thrown
  CsvWriter(const CsvWriter&) = delete;
  CsvWriter& operator=(const CsvWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  // Throws Error naming the file when a write fails.
  void flush();

 private:
  std::string log_dir_;
  std::set<std::string> started_;             // files whose header row this process wrote
  std::map<std::string, std::string> pending_;  // path -> rows not yet written
};

// "Train/Samples/lr" -> "Train_Samples_lr".
std::string csv_file_stem(const std::string& tag);
// Python's repr() of a float: the shortest string that reads back as the same double, in
// Python's layout ("0.001", "65536.0", "1e-05", "1.5e+16", "nan", "inf").
std::string python_float_repr(double value);

}  // namespace monitor
}  // namespace deepspeed
