// An environment variable changed for a scope and given back as it was (set, or unset) at its end.
// ScopedEnv(name) only saves it (the test changes it itself); ScopedEnv(name, value) also sets it,
// nullptr unsetting it.
#pragma once
#include <cstdlib>
#include <string>

namespace dstest {

class ScopedEnv {
 public:
  explicit ScopedEnv(const char* name) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
  }
  ScopedEnv(const char* name, const char* value) : ScopedEnv(name) {
    if (value != nullptr)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_.c_str(), old_.c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

}  // namespace dstest
