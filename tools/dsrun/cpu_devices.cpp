#include "cpu_devices.h"

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "spawn.h"

namespace deepspeed {
namespace launcher {
namespace {

// N of a directory entry "nodeN", or -1 for any other name ("online", "possible", "power", ...).
int node_id(const std::string& name) {
  if (name.size() <= 4 || name.compare(0, 4, "node") != 0) return -1;
  const std::string digits = name.substr(4);
  if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoi(digits);
}

// The file's text without surrounding white space ("" when it cannot be read).
std::string read_trimmed(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  const auto blank = [](unsigned char c) { return std::isspace(c) != 0; };
  while (!s.empty() && blank(s.back())) s.pop_back();
  s.erase(s.begin(), std::find_if_not(s.begin(), s.end(), blank));
  return s;
}

}  // namespace

int numa_node_count(const std::string& sysfs_root) {
  const std::string dir = sysfs_root + "/devices/system/node";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  std::vector<std::pair<int, std::string>> nodes;  // (N, nodeN)
  while (const dirent* e = ::readdir(d)) {
    const int id = node_id(e->d_name);
    if (id >= 0) nodes.emplace_back(id, e->d_name);
  }
  ::closedir(d);
  std::sort(nodes.begin(), nodes.end());
  // The kernel writes a cpulist in one canonical form ("0-3,8-11"), so equal sets read equal.
  // As DeepSpeed's loop, `previous` is the last node counted: a CPU-less node in between does
  // not part two copies of one node's CPUs.
  int count = 0;
  std::string previous;
  for (const auto& [id, name] : nodes) {
    const std::string cpus = read_trimmed(dir + "/" + name + "/cpulist");
    if (cpus.empty() || cpus == previous) continue;
    ++count;
    previous = cpus;
  }
  return count;
}

int cpu_device_count(const char* local_size, const std::string& sysfs_root) {
  if (local_size && *local_size) {
    errno = 0;
    char* end = nullptr;
    const long n = std::strtol(local_size, &end, 10);
    if (errno != 0 || *end != '\0' || n > INT_MAX || n < INT_MIN)
      throw LaunchError(std::string("LOCAL_SIZE=") + local_size +
                        " is not an integer (on a machine without GPUs it is the number of ranks "
                        "to start, as DeepSpeed's CPU accelerator reads it); unset it or give "
                        "--num_procs");
    if (n > 0) return static_cast<int>(n);
  }
  return std::max(1, numa_node_count(sysfs_root));
}

}  // namespace launcher
}  // namespace deepspeed
