#include "support/tfevents.h"

#include <dirent.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "support/files.h"

namespace dstest {

CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  const int status = ::pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

CommandResult read_event_file(const std::string& event_file) {
  // Debian's python3 (where python3-protobuf lives), not whatever python3 comes first on PATH.
  const std::string python = "/usr/bin/python3";
  const std::string src = source_dir();
  return run_command(python + " " + src + "/tests/support/tfevents_read.py " + src +
                     "/src/monitor/proto/tensorboard_event.proto '" + event_file + "'");
}

std::vector<std::string> files_containing(const std::string& dir, const std::string& part) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.find(part) != std::string::npos) out.push_back(dir + "/" + name);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> lines_starting(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  return out;
}

}  // namespace dstest
