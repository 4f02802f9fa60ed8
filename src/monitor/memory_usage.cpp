#include "monitor/memory_usage.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "deepspeed/device.h"

namespace deepspeed {
namespace monitor {
namespace {

// "VmHWM:     12345 kB" -> bytes, from a /proc file of "Key: value kB" lines.
int64_t proc_kb(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    int64_t kb = 0;
    fields >> kb;
    return kb * 1024;
  }
  return 0;
}

// Python's round(x, 2) printed as str() ("1.5", "0.0").
std::string python_round2(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", std::round(x * 100.0) / 100.0);
  std::string s = buf;
  while (s.size() > 1 && s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
  return s;
}
std::string gb(int64_t bytes) { return python_round2(static_cast<double>(bytes) / (1 << 30)); }
std::string mb(int64_t bytes) { return python_round2(static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

HostMemory host_memory() {
  HostMemory h;
  h.rss = proc_kb("/proc/self/status", "VmRSS");
  h.peak_rss = proc_kb("/proc/self/status", "VmHWM");
  h.total = proc_kb("/proc/meminfo", "MemTotal");
  h.available = proc_kb("/proc/meminfo", "MemAvailable");
  return h;
}

std::vector<std::string> memory_usage_lines(const std::string& message, const MemoryReport& s,
                                            c10::Device device) {
  std::vector<std::string> lines{message};
  if (device.is_cuda()) {
    // DeepSpeed's MA / Max_MA / CA / Max_CA; the device abstraction offers no current reserved
    // figure, so CA is left out.
    const auto d = device_memory(device);
    lines.push_back("MA " + gb(d.allocated) + " GB         Max_MA " + gb(d.allocated_peak) +
                    " GB         Max_CA " + gb(d.reserved_peak) + " GB ");
  }
  const HostMemory h = host_memory();
  const int64_t used = h.total - h.available;
  lines.push_back("CPU Virtual Memory:  used = " + gb(used) +
                  " GB, percent = " + python_round2(h.total > 0 ? 100.0 * used / h.total : 0.0) + "%");
  std::string states = "model states (MB): parameters " + mb(s.parameters) + " | gradients " +
                       mb(s.gradients) + " | optimizer states " + mb(s.optimizer_states) +
                       " | comm buffers " + mb(s.comm_buffers);
  if (s.peak_gathered_bytes > 0)
    states += " | gathered " + mb(s.gathered_bytes) + " (peak " + mb(s.peak_gathered_bytes) + ")";
  states += " | total " + mb(s.total());
  if (s.nvme_bytes > 0) states += " | on NVMe " + mb(s.nvme_bytes);
  lines.push_back(states);
  lines.push_back("process RSS (MB): now " + mb(h.rss) + " | peak (VmHWM) " + mb(h.peak_rss));
  return lines;
}

}  // namespace monitor
}  // namespace deepspeed
