#include "support/swap_files.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

namespace dstest {

std::vector<std::string> unlinked_files_in(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string prefix = fs::canonical(dir).string() + "/";
  const std::string deleted = " (deleted)";  // what the kernel appends to an unlinked file's link
  std::vector<std::pair<int, std::string>> found;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    char target[4096];
    const ssize_t n = ::readlink(entry.path().c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;  // closed meanwhile
    const std::string link(target, static_cast<size_t>(n));
    if (link.size() <= prefix.size() + deleted.size() ||
        link.compare(0, prefix.size(), prefix) != 0 ||
        link.compare(link.size() - deleted.size(), deleted.size(), deleted) != 0)
      continue;
    const std::string name =
        link.substr(prefix.size(), link.size() - prefix.size() - deleted.size());
    if (name.find('/') != std::string::npos) continue;  // in a subfolder
    found.emplace_back(std::stoi(entry.path().filename().string()), entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& f : found) paths.push_back(f.second);
  return paths;
}

}  // namespace dstest
