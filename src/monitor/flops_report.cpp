// DeepSpeed's flops-profiler report (print_model_profile), line for line: the summary, the
// aggregated profile per depth and the module tree annotated as PyTorch's repr would print it.
// Python's formatting is reproduced where DeepSpeed relies on it: round(x, 2) then "{:g}",
// "{:<70}  {:<8}" for summary lines, dict repr for the top modules.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "deepspeed/errors.h"
#include "deepspeed/flops_profiler.h"

namespace deepspeed {
namespace profiling {
namespace {

double round2(double x) { return std::round(x * 100.0) / 100.0; }

std::string g(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// Python's str() of a float rounded to 2 decimals ("12.0", "123.46").
std::string py_float(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", round2(x));
  std::string s = buf;
  while (s.size() > 1 && s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
  return s;
}

std::string line(const std::string& key, const std::string& value) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%-70s  %-8s\n", key.c_str(), value.c_str());
  return buf;
}

std::string pct(double part, double total) {
  return g(total != 0 ? round2(100.0 * part / total) : 0);
}

// PyTorch's _addindent: every line but the first indented by `n` spaces.
std::string add_indent(const std::string& s, int n) {
  std::string out;
  for (char c : s) {
    out += c;
    if (c == '\n') out.append(n, ' ');
  }
  return out;
}

struct Totals {
  double params, macs, duration;
};

std::string module_repr(const std::vector<ModuleProfile>& m, int i, const Totals& t) {
  const auto& p = m[i];
  std::string extra = params_to_string(p.params) + " = " + pct(p.params, t.params) + "% Params, " +
                      macs_to_string(p.macs) + " = " + pct(p.macs, t.macs) + "% MACs, " +
                      duration_to_string(p.latency_s) + " = " + pct(p.latency_s, t.duration) +
                      "% latency, " +
                      flops_to_string(p.latency_s > 0 ? round2(p.flops / p.latency_s) : 0);
  if (!p.extra.empty()) extra += ", " + p.extra;
  std::string s = p.type + "(";
  if (p.children.empty()) return s + extra + ")";
  s += "\n  " + extra;
  for (int c : p.children) s += "\n  (" + m[c].name + "): " + add_indent(module_repr(m, c, t), 2);
  return s + "\n)";
}

// "{'Linear': '1.2 M', 'LayerNorm': '512'}": per class at a depth, the top k by one figure.
template <class Format>
std::string top_dict(const std::vector<std::pair<std::string, std::array<double, 3>>>& classes,
                     int which, int64_t k, Format format) {
  std::vector<size_t> order(classes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return classes[a].second[which] > classes[b].second[which];
  });
  std::string s = "{";
  for (size_t i = 0; i < order.size() && static_cast<int64_t>(i) < k; ++i) {
    if (i) s += ", ";
    s += "'" + classes[order[i]].first + "': '" + format(classes[order[i]].second[which]) + "'";
  }
  return s + "}";
}

std::string aggregated(const std::vector<ModuleProfile>& m, const ReportOptions& o) {
  // Per depth, per class in the order first met (DeepSpeed's walk): MACs, params, latency.
  std::vector<std::vector<std::pair<std::string, std::array<double, 3>>>> info;
  for (const auto& p : m) {
    if (static_cast<int>(info.size()) <= p.depth) info.resize(p.depth + 1);
    auto& level = info[p.depth];
    auto it =
        std::find_if(level.begin(), level.end(), [&](const auto& e) { return e.first == p.type; });
    if (it == level.end()) it = level.insert(level.end(), {p.type, {0, 0, 0}});
    it->second[0] += p.macs;
    it->second[1] += p.params;
    it->second[2] += p.latency_s;
  }
  // DeepSpeed prints depths 0 .. depth-1 (module_depth -1: all but the innermost).
  const int64_t depth =
      o.module_depth == -1 ? static_cast<int64_t>(info.size()) - 1 : o.module_depth;
  std::string s = "Top " + std::to_string(o.top_modules) +
                  " modules in terms of params, MACs or fwd latency at different model depths:\n";
  for (int64_t d = 0; d < depth && d < static_cast<int64_t>(info.size()); ++d) {
    s += "depth " + std::to_string(d) + ":\n";
    s += "    params      - " +
         top_dict(info[d], 1, o.top_modules, [](double v) { return params_to_string(v); }) + "\n";
    s += "    MACs        - " +
         top_dict(info[d], 0, o.top_modules, [](double v) { return macs_to_string(v); }) + "\n";
    s += "    fwd latency - " +
         top_dict(info[d], 2, o.top_modules, [](double v) { return duration_to_string(v); }) + "\n";
  }
  return s;
}

std::string summary(const FlopsProfiler& prof, const ReportOptions& o, const RunFacts& f) {
  const double flops = prof.get_total_flops(), macs = prof.get_total_macs();
  const double params = prof.get_total_params();
  std::string s =
      "\n-------------------------- DeepSpeed Flops Profiler --------------------------\n";
  s += "Profile Summary at step " + std::to_string(o.profile_step) + ":\n";
  s +=
      "Notations:\n"
      "data parallel size (dp_size), model parallel size(mp_size),\n"
      "number of parameters (params), number of multiply-accumulate operations(MACs),\n"
      "number of floating-point operations (flops), floating-point operations per second (FLOPS),\n"
      "fwd latency (forward propagation latency), bwd latency (backward propagation latency),\n"
      "step (weights update latency), iter latency (sum of fwd, bwd and step latency)\n\n";
  if (f.from_engine) {
    s += line("world size: ", std::to_string(f.world_size));
    s += line("data parallel size: ", std::to_string(f.dp_size));
    s += line("model parallel size: ", std::to_string(f.mp_size));
    s += line("batch size per GPU: ", std::to_string(f.micro_batch_size));
  }
  s += line("params per GPU: ", params_to_string(params));
  s += line("params of model = params per GPU * mp_size: ",
            params_to_string(f.from_engine ? params * f.mp_size : 0));
  s += line("fwd MACs per GPU: ", macs_to_string(macs));
  s += line("fwd flops per GPU: ", number_to_string(flops));
  s += line("fwd flops of model = fwd flops per GPU * mp_size: ",
            number_to_string(flops * (f.from_engine ? f.mp_size : 1)));
  const double fwd = f.fwd_latency_s >= 0 ? f.fwd_latency_s : prof.get_total_duration();
  s += line("fwd latency: ", duration_to_string(fwd));
  s += line("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ",
            flops_to_string(fwd > 0 ? flops / fwd : 0));
  if (f.bwd_latency_s >= 0 && f.step_latency_s >= 0) {
    const double factor = 2 + f.recompute_fwd_factor, bwd = f.bwd_latency_s;
    s += line("bwd latency: ", duration_to_string(bwd));
    s += line("bwd FLOPS per GPU = " + g(factor) + " * fwd flops per GPU / bwd latency: ",
              flops_to_string(bwd > 0 ? factor * flops / bwd : 0));
    s += line(
        "fwd+bwd FLOPS per GPU = " + g(factor + 1) + " * fwd flops per GPU / (fwd+bwd latency): ",
        flops_to_string(fwd + bwd > 0 ? (factor + 1) * flops / (fwd + bwd) : 0));
    s += line("step latency: ", duration_to_string(f.step_latency_s));
    const double iter = fwd + bwd + f.step_latency_s;
    s += line("iter latency: ", duration_to_string(iter));
    const double achieved = iter > 0 ? (factor + 1) * flops / iter : 0;
    s += line("FLOPS per GPU = " + g(factor + 1) + " * fwd flops per GPU / iter latency: ",
              flops_to_string(achieved));
    s += line("samples/second: ", py_float(iter > 0 ? f.samples_per_iter / iter : 0));
    // deepspeed.cpp: model FLOP utilisation against flops_profiler.peak_tflops.
    if (f.peak_tflops > 0)
      s += line("MFU = FLOPS per GPU / peak (" + g(f.peak_tflops) + " TFLOPS): ",
                g(round2(100.0 * achieved / (f.peak_tflops * 1e12))) + "%");
  }
  return s;
}

}  // namespace

std::string number_to_string(double num, const std::string& units_in) {
  double magnitude = 1;
  std::string units = units_in;
  if (units.empty()) {
    if (num >= 1e12)
      magnitude = 1e12, units = "T";
    else if (num >= 1e9)
      magnitude = 1e9, units = "G";
    else if (num >= 1e6)
      magnitude = 1e6, units = "M";
    else if (num >= 1e3)
      magnitude = 1e3, units = "K";
    else if (num >= 1 || num == 0)
      magnitude = 1, units = "";
    else if (num >= 1e-3)
      magnitude = 1e-3, units = "m";
    else
      magnitude = 1e-6, units = "u";
  } else {
    const std::string u = units;
    magnitude = u == "T"   ? 1e12
                : u == "G" ? 1e9
                : u == "M" ? 1e6
                : u == "K" ? 1e3
                : u == "m" ? 1e-3
                : u == "u" ? 1e-6
                           : 1;
  }
  return g(round2(num / magnitude)) + " " + units;
}

std::string flops_to_string(double flops) { return number_to_string(flops) + "FLOPS"; }
std::string macs_to_string(double macs) { return number_to_string(macs) + "MACs"; }
std::string duration_to_string(double seconds) { return number_to_string(seconds) + "s"; }
std::string params_to_string(double params) {
  std::string s = number_to_string(params);
  for (auto& c : s)
    if (c == 'G') c = 'B';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string FlopsProfiler::model_profile(const ReportOptions& o, const RunFacts& f) const {
  const auto& m = modules();
  if (m.empty()) return "";
  std::string s = summary(*this, o, f);
  s += "\n----------------------------- Aggregated Profile per GPU -----------------------------\n";
  s += aggregated(m, o);
  if (o.detailed) {
    s += "\n------------------------------ Detailed Profile per GPU "
         "------------------------------\n";
    s += "Each module profile is listed after its name in the following order: \n"
         "params, percentage of total params, MACs, percentage of total MACs, fwd latency, "
         "percentage of total fwd latency, fwd FLOPS\n";
    s += "\nNote: 1. A module can have torch.nn.module or torch.nn.functional to compute logits "
         "(e.g. CrossEntropyLoss). They are not counted as submodules, thus not to be printed "
         "out. However they make up the difference between a parent's MACs (or latency) and the "
         "sum of its submodules'.\n2. Number of floating-point operations is a theoretical "
         "estimation, thus FLOPS computed using that could be larger than the maximum system "
         "throughput.\n3. The fwd latency listed in the top module's profile is directly captured "
         "at the module forward function in PyTorch, thus it's less than the fwd latency shown "
         "above which is captured in DeepSpeed.\n\n";
    const Totals t{static_cast<double>(m[0].params), static_cast<double>(m[0].macs),
                   m[0].latency_s};
    s += module_repr(m, 0, t) + "\n";
  }
  s += "------------------------------------------------------------------------------\n";
  return s;
}

void FlopsProfiler::print_model_profile(const ReportOptions& o, const RunFacts& f,
                                        const std::string& output_file) const {
  const std::string text = model_profile(o, f);
  if (output_file.empty()) {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    return;
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto dir = fs::absolute(output_file).parent_path();
  fs::create_directories(dir, ec);
  std::ofstream out(output_file, std::ios::trunc);
  out << text;
  out.flush();
  if (!out)
    throw ConfigError("config key 'flops_profiler.output_file' (\"" + output_file +
                      "\"): cannot write the report" + (ec ? ": " + ec.message() : ""));
}

}  // namespace profiling
}  // namespace deepspeed
