// Reading back what the monitors wrote: TensorBoard event files through the independent Python
// reader (tests/support/tfevents_read.py, python3-protobuf + protoc), and monitor folders.
#pragma once
#include <string>
#include <vector>

namespace dstest {

struct CommandResult {
  int status = -1;     // exit status; -1 when it did not exit normally
  std::string output;  // stdout and stderr together
};
CommandResult run_command(const std::string& command);

// Runs the reader on `event_file` with the library's tensorboard_event.proto. status 0: output
// holds its lines; 3: python3-protobuf or protoc is missing (the caller skips, saying so).
CommandResult read_event_file(const std::string& event_file);

// The files in `dir` whose names contain `part`, sorted.
std::vector<std::string> files_containing(const std::string& dir, const std::string& part);

// The lines of `text` that start with `prefix`.
std::vector<std::string> lines_starting(const std::string& text, const std::string& prefix);

}  // namespace dstest
