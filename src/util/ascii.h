// ASCII lower-casing for names a user may write in any case (optimizer and scheduler types, dtype
// and device names, partition methods, hostnames). Header only: dsrun, which does not link the
// library, uses it too. Locale-free on purpose: "ADAMW" must read as "adamw" under any locale.
#pragma once
#include <string>

namespace deepspeed {

inline std::string ascii_lower(std::string s) {
  for (auto& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

}  // namespace deepspeed
