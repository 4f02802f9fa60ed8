#include "monitor/csv_writer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "monitor/append_file.h"

namespace deepspeed {
namespace monitor {

std::string csv_file_stem(const std::string& tag) {
  std::string s = tag;
  for (char& c : s)
    if (c == '/' || c == ' ') c = '_';
  return s;
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // The shortest precision that round-trips (as Python's repr), in scientific form: digits and
  // the decimal exponent.
  char sci[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(sci, sizeof sci, "%.*e", precision - 1, value);
    if (std::strtod(sci, nullptr) == value) break;
  }
  std::string s(sci);
  const size_t e = s.find('e');
  const int exponent = std::atoi(s.c_str() + e + 1);
  std::string mantissa = s.substr(0, e);
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits.push_back(c);
  std::string out;
  // Python: positional for -4 <= exponent < 16, else scientific with at least two exponent digits.
  if (exponent < -4 || exponent >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  } else if (exponent < 0) {
    out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  } else {
    const size_t int_digits = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= int_digits) {
      out = digits + std::string(int_digits - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_digits) + "." + digits.substr(int_digits);
    }
  }
  return negative ? "-" + out : out;
}

void CsvWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  const std::string stem = csv_file_stem(tag);
  const std::string path = log_dir_ + "/" + stem + ".csv";
  std::string& rows = pending_[path];
  if (started_.insert(path).second) {
    const size_t slash = tag.rfind('/');
    rows += "step," + (slash == std::string::npos ? tag : tag.substr(slash + 1)) + "\r\n";
  }
  rows += std::to_string(step) + "," + python_float_repr(value) + "\r\n";
}

void CsvWriter::flush() {
  for (auto& [path, rows] : pending_) {
    if (rows.empty()) continue;
    const int fd = open_for_append(path);
    try {
      write_all(fd, rows, path);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    rows.clear();
  }
}

CsvWriter::~CsvWriter() {
  try {
    flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[deepspeed] csv_monitor: %s\n", e.what());
  }
}

}  // namespace monitor
}  // namespace deepspeed
