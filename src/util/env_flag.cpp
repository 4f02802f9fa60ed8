#include "util/env_flag.h"

#include <cstdlib>

#include <fmt/format.h>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace util {

bool flag_from_env(const char* name, bool unset, const std::string& on, const std::string& off) {
  return flag_from_value(name, std::getenv(name), unset, on, off);
}

bool flag_from_value(const char* name, const char* v, bool unset, const std::string& on,
                     const std::string& off) {
  if (v == nullptr || *v == 0) return unset;
  const std::string s = v;
  if (s == "1" || s == "true") return true;
  if (s == "0" || s == "false") return false;
  throw ConfigError(fmt::format(
      "environment variable {}='{}' must be 1/true ({}) or 0/false ({})", name, s, on, off));
}

}  // namespace util
}  // namespace deepspeed
