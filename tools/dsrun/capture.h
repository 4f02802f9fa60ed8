// Short helper commands the launcher runs to completion and reads back (the host checks over ssh):
// several at once, each with its own time limit, in one poll loop (no threads: a fork from one of
// several threads could inherit a lock another thread held).
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace deepspeed {
namespace launcher {

// What one finished command left: its exit status (waitpid form) and what it wrote.
struct Captured {
  int status = 0;
  bool timed_out = false;  // killed (its process group) when its limit passed
  std::string out, err;
};

// Runs every command of `commands` (argv, argv[0] looked up on PATH), at most `at_once` of them at
// a time, each for at most `limit` from its own start; returns their results in the same order.
// The start of a later command does not wait for an earlier one to end, so n host checks take
// about the time of the slowest, not the sum (dsrun's host check of a 64-node job was 64 ssh
// round trips one after the other). Throws LaunchError when a pipe or fork fails, or a program
// is not found on PATH.
std::vector<Captured> run_all_captured(const std::vector<std::vector<std::string>>& commands,
                                       std::chrono::steady_clock::duration limit, size_t at_once);

// The last line of `text`, trailing newlines dropped ("" for empty text).
std::string last_line(const std::string& text);

}  // namespace launcher
}  // namespace deepspeed
