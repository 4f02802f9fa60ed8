// Runs test code in a forked child, where a limit it sets (RLIMIT_AS, RLIMIT_NOFILE) stays with
// the child instead of constraining the rest of the test program.
#pragma once
#include <functional>

namespace dstest {

// Forks, runs `body` in the child and returns the child's wait status. The child exits with what
// `body` returns, or with 1 after printing the message of an exception that left it (stdio is
// flushed first). A test expects WIFEXITED(status) && WEXITSTATUS(status) == 0.
int run_in_child(const std::function<int()>& body);

}  // namespace dstest
