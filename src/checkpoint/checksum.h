// CRC32C (Castagnoli, the iSCSI/ext4/LevelDB checksum): detects torn and bit-flipped checkpoint
// files. Uses the SSE4.2 crc32 instruction when the CPU has it (~10 GB/s), else an 8-way table
// (~1-2 GB/s); both give identical results. Thread-safe.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace deepspeed {
namespace checkpoint {

// Streaming form: extend(extend(0, a), b) == crc32c(a + b).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

// The portable path alone, so tests can check the fast path against it.
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);

// 8 lowercase hex digits of crc32c(data, n), e.g. "e3069283" for "123456789".
std::string hex_checksum(const void* data, size_t n);
std::string to_hex32(uint32_t value);

// The manifest's name for the algorithm above.
constexpr const char* kChecksumAlgorithm = "crc32c";

}  // namespace checkpoint
}  // namespace deepspeed
