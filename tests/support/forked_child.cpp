#include "support/forked_child.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>

namespace dstest {

int run_in_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 0;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child failed: %s\n", e.what());
      code = 1;
    }
    std::fflush(nullptr);
    _exit(code);  // no atexit handlers or static destructors of the parent's state
  }
  int status = -1;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return -1;
  return status;
}

}  // namespace dstest
