// CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected), the checksum of every kvstore
// chunk. Uses the SSE4.2 crc32 instruction when the CPU has it, else a table.
#pragma once

#include <cstdint>
#include <string_view>

namespace lazyrag {

// Returns the CRC-32C of `data` continued from `crc` (the CRC of the bytes before it; 0 for
// none), so Crc32cExtend(Crc32c(a), b) == Crc32c(a + b). Thread-safe.
uint32_t Crc32cExtend(uint32_t crc, std::string_view data);

inline uint32_t Crc32c(std::string_view data) { return Crc32cExtend(0, data); }

namespace internal {
// The table-driven path, exposed so tests can check it on machines with SSE4.2 too.
uint32_t Crc32cExtendPortable(uint32_t crc, std::string_view data);
}  // namespace internal

}  // namespace lazyrag
