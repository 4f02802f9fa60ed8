// The c10d store holds byte vectors; the keys deepspeed writes there (failure board, peer watch,
// comms check, shared-memory rendezvous) hold text.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace deepspeed::comm {

inline std::vector<uint8_t> store_bytes(const std::string& s) { return {s.begin(), s.end()}; }
inline std::string store_string(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

}  // namespace deepspeed::comm
