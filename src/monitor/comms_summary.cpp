#include "monitor/comms_summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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
// latencies and to each call's algbw and busbw: sorted, k = round(0.1·n) values dropped at each
// end (Python's round: half to even, so n = 5 drops none, n = 15 and n = 25 two), the rest
// averaged. A call's bandwidth falls as its latency grows, so the bandwidths DeepSpeed keeps are
// those of the latencies kept here. Returns the kept latencies, ascending (none of none: the
// averages print 0, as DeepSpeed's trim_mean of an empty list).
std::vector<double> trimmed(std::vector<double> latencies_ms) {
  const size_t n = latencies_ms.size();
  // nearbyint rounds half to even in the default rounding mode, as Python's round.
  const auto k = static_cast<size_t>(std::nearbyint(static_cast<double>(n) * 0.1));
  std::sort(latencies_ms.begin(), latencies_ms.end());
  return std::vector<double>(latencies_ms.begin() + k, latencies_ms.end() - k);
}

// The mean of f(x) over v; 0 for none.
double mean_over(const std::vector<double>& v, double (*f)(double)) {
  if (v.empty()) return 0.0;
  double sum = 0.0;
  for (double x : v) sum += f(x);
  return sum / static_cast<double>(v.size());
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

std::string comms_summary_table(const comm::CommStats& stats, int world_size,
                                const std::set<std::string>& prof_ops) {
  std::string out = pad("Comm. Op") + pad("Message Size") + pad("Count") +
                    pad("Total Latency(ms)") + pad("Avg Latency(ms)") + pad("tput_avg (Gbps)") +
                    pad("busbw_avg (Gbps)") + "\n";
  for (const auto& [op, s] : stats) {
    if (s.by_size.empty()) continue;
    if (!prof_ops.empty() && !prof_ops.count(op)) continue;
    out += op + "\n";
    for (const auto& [bytes, sz] : s.by_size) {
      // Count and total: every call; the averages: DeepSpeed's trimmed means.
      const std::vector<double> kept = trimmed(sz.latencies_ms);
      const double avg = mean_over(kept, [](double ms) { return ms; });
      // DeepSpeed averages each call's bandwidth (CommsLogger.append / log_all): the bandwidth
      // at 1 ms times the mean of 1/latency.
      const auto [algbw_1ms, busbw_1ms] =
          bandwidth_gbps(op, static_cast<double>(bytes), 1.0, world_size);
      const double mean_inv_ms = mean_over(kept, inverse_ms);
      const double algbw = algbw_1ms * mean_inv_ms, busbw = busbw_1ms * mean_inv_ms;
      out += pad("") + pad(convert_size(bytes)) +
             pad(std::to_string(sz.calls)) + pad(two_decimals(sz.total_ms)) + pad(two_decimals(avg)) +
             pad(two_decimals(algbw)) + pad(two_decimals(busbw)) + "\n";
    }
  }
  return out;
}

}  // namespace monitor
}  // namespace deepspeed
