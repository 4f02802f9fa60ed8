// Reading the flops profiler's printed report in tests.
#pragma once
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace dstest {

// The MACs column of the report's detailed tree (from the line naming the GPT root down), one
// entry per module in print order; empty when the report has no GPT tree.
inline std::vector<std::string> macs_column(const std::string& report) {
  std::vector<std::string> out;
  const auto at = report.find("\nGPT(");
  if (at == std::string::npos) return out;
  std::istringstream lines(report.substr(at));
  const std::regex macs(R"(, ([0-9.]+ [KMGT]?MACs) = )");
  std::smatch m;
  for (std::string line; std::getline(lines, line);)
    if (std::regex_search(line, m, macs)) out.push_back(m[1]);
  return out;
}

}  // namespace dstest
