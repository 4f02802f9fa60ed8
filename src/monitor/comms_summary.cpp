#include "monitor/comms_summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <vector>

#include "monitor/csv_writer.h"

namespace deepspeed {
namespace monitor {
namespace {

// The collective's kind: the name without comms_logger.debug's " | [Caller Func: ...]".
std::string kind_of(const std::string& op) { return op.substr(0, op.find(" | ")); }

bool gathers(const std::string& name) {
  const std::string op = kind_of(name);
  return op == "all_gather" || op == "reduce_scatter" || op == "reduce_scatter_v";
}

std::string pad(const std::string& s, size_t width = 20) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

// DeepSpeed's trim_mean(data, 0.1) (deepspeed/utils/timer.py), which log_all applies to the
// latencies and to each call's algbw and busbw, each list on its own: sorted, k = round(0.1·n)
// values dropped at each end (Python's round: half to even, so n = 5 drops none, n = 15 and
// n = 25 two), the rest averaged; 0 for none (as DeepSpeed's trim_mean of an empty list).
double trim_mean(std::vector<double> v) {
  const size_t n = v.size();
  // nearbyint rounds half to even in the default rounding mode, as Python's round.
  const auto k = static_cast<size_t>(std::nearbyint(static_cast<double>(n) * 0.1));
  if (n == 0 || 2 * k >= n) return 0.0;
  std::sort(v.begin(), v.end());
  double sum = 0.0;
  for (size_t i = k; i < n - k; ++i) sum += v[i];
  return sum / static_cast<double>(n - 2 * k);
}

// 1/ms, the factor of a call's bandwidth; a latency the clock could not tell from 0 counts as 1 ns.
double inverse_ms(double ms) { return 1.0 / (ms > 1e-6 ? ms : 1e-6); }

std::string two_decimals(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

}  // namespace

std::string convert_size(int64_t bytes) {
  if (bytes <= 0) return "0B";
  static const char* const kNames[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  int i = static_cast<int>(std::floor(std::log(static_cast<double>(bytes)) / std::log(1024.0)));
  if (i < 0) i = 0;
  if (i > 6) i = 6;
  const double scaled = std::round(bytes / std::pow(1024.0, i) * 100.0) / 100.0;
  return python_float_repr(scaled) + " " + kNames[i];
}

std::pair<double, double> bandwidth_gbps(const std::string& op, double size, double ms,
                                         int world_size) {
  if (ms <= 0.0) return {0.0, 0.0};
  const double n = world_size;
  double algbw = 0.0, busbw = 0.0;  // bytes per ms
  if (kind_of(op) == "all_reduce") {
    algbw = 2.0 * size / ms;
    busbw = size / ms * (2.0 * (n - 1.0) / n);
  } else if (kind_of(op) == "all_to_all") {
    algbw = size / ms;
    busbw = algbw * ((n - 1.0) / n);
  } else if (gathers(op)) {
    algbw = size * n / ms;
    busbw = algbw * ((n - 1.0) / n);
  } else {
    algbw = busbw = size / ms;
  }
  // bytes/ms -> Gbit/s: ·8 bits, ·1e3 ms/s, /1e9 (DeepSpeed: ·8 / 1e6).
  return {algbw * 8.0 / 1e6, busbw * 8.0 / 1e6};
}

std::string verbose_line(const std::string& op, int64_t bytes, double ms, int world_size) {
  const auto [algbw, busbw] = bandwidth_gbps(op, static_cast<double>(bytes), ms, world_size);
  return "comm op: " + op + " | time (ms): " + two_decimals(ms) + " | msg size: " + convert_size(bytes) +
         " | algbw (Gbps): " + two_decimals(algbw) + " | busbw (Gbps): " + two_decimals(busbw);
}

// One row of the table (op, message size) over every group: DeepSpeed's record of
// [count, latencies, algbws, busbws]. Each call's bandwidths are computed here from its
// latency and its group's n, as DeepSpeed's append() computes them per call: a row may mix
// groups of different sizes, so neither the summed latencies nor one n per row would do.
struct Row {
  int64_t calls = 0;
  double total_ms = 0.0;
  std::vector<double> latencies_ms, algbw, busbw;
};

std::string comms_summary_table(const std::vector<GroupStats>& groups,
                                const std::set<std::string>& prof_ops) {
  std::map<std::string, std::map<int64_t, Row>> rows;
  for (const GroupStats& g : groups) {
    for (const auto& [op, s] : g.stats) {
      if (!prof_ops.empty() && !prof_ops.count(op)) continue;
      for (const auto& [bytes, sz] : s.by_size) {
        Row& row = rows[op][bytes];
        row.calls += sz.calls;
        row.total_ms += sz.total_ms;
        // The bandwidth at 1 ms, times 1/latency for each call.
        const auto [algbw_1ms, busbw_1ms] =
            bandwidth_gbps(op, static_cast<double>(bytes), 1.0, g.world_size);
        for (double ms : sz.latencies_ms) {
          row.latencies_ms.push_back(ms);
          row.algbw.push_back(algbw_1ms * inverse_ms(ms));
          row.busbw.push_back(busbw_1ms * inverse_ms(ms));
        }
      }
    }
  }
  std::string out = pad("Comm. Op") + pad("Message Size") + pad("Count") +
                    pad("Total Latency(ms)") + pad("Avg Latency(ms)") + pad("tput_avg (Gbps)") +
                    pad("busbw_avg (Gbps)") + "\n";
  for (const auto& [op, sizes] : rows) {
    out += op + "\n";
    // Count and total: every call; the averages: DeepSpeed's trimmed means.
    for (const auto& [bytes, row] : sizes)
      out += pad("") + pad(convert_size(bytes)) + pad(std::to_string(row.calls)) +
             pad(two_decimals(row.total_ms)) + pad(two_decimals(trim_mean(row.latencies_ms))) +
             pad(two_decimals(trim_mean(row.algbw))) + pad(two_decimals(trim_mean(row.busbw))) +
             "\n";
  }
  return out;
}

std::string comms_summary_table(const comm::CommStats& stats, int world_size,
                                const std::set<std::string>& prof_ops) {
  return comms_summary_table(std::vector<GroupStats>{{stats, world_size}}, prof_ops);
}

}  // namespace monitor
}  // namespace deepspeed
