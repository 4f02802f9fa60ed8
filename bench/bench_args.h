// The benchmarks' command lines. Most take positional numbers (`bench_x [n=8] [reps=5]`), which
// std::atoi read "--help" as 0 before, running the benchmark with it. Here -h/--help anywhere
// prints the usage line to stdout and exits 0; an argument that is not a number, one too many or
// a bad flag value prints what is wrong (naming the argument) and the usage line to stderr and
// exits 2, as CLI11 does for the other programs.
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

class BenchArgs {
 public:
  // usage: the whole line, "Usage: bench_x [n=8] [reps=5]". Exits 0 on -h/--help.
  BenchArgs(int argc, char** argv, std::string usage)
      : argc_(argc), argv_(argv), usage_(std::move(usage)) {
    for (int i = 1; i < argc; ++i) {
      if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
        std::printf("%s\n", usage_.c_str());
        std::exit(0);
      }
    }
  }

  // Exits 2 when there are more than n arguments (a mistyped flag would otherwise be ignored).
  void at_most(int n) const {
    if (argc_ - 1 > n)
      fail("at most " + std::to_string(n) + " arguments, got " + std::to_string(argc_ - 1));
  }

  // Positional argument i (1-based) as a whole number; fallback when there are fewer arguments.
  int64_t number(int i, int64_t fallback) const {
    return i < argc_ ? whole_number(argv_[i], "argument " + std::to_string(i)) : fallback;
  }
  std::string text(int i, const std::string& fallback) const {
    return i < argc_ ? std::string(argv_[i]) : fallback;
  }

  // `value` (of `what`: "argument 2", "--sizes") read whole as a number; exits 2 naming both
  // when it is not one ("12x", "", "--help" all fail).
  int64_t whole_number(const std::string& value, const std::string& what) const {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || errno == ERANGE)
      fail(what + ": '" + value + "' is not a whole number");
    return v;
  }
  double real_number(const std::string& value, const std::string& what) const {
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || errno == ERANGE)
      fail(what + ": '" + value + "' is not a number");
    return v;
  }

  [[noreturn]] void fail(const std::string& what) const {
    std::fprintf(stderr, "%s: %s\n%s\n", program(), what.c_str(), usage_.c_str());
    std::exit(2);
  }

 private:
  const char* program() const {
    if (argc_ < 1) return "bench";
    const char* slash = std::strrchr(argv_[0], '/');
    return slash ? slash + 1 : argv_[0];
  }

  int argc_;
  char** argv_;
  std::string usage_;
};
