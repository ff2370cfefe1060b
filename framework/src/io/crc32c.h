// CRC-32C (Castagnoli), the checksum of checkpoint ranges: the one the
// SSE4.2 crc32 instruction computes (three chains at once where the input
// allows), so checking a range costs a fraction of reading it.
// crc32c_reference is the plain bytewise table version the fast one is
// tested against (and used where the instruction is missing). Part of the host.
// Thread safety: pure.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ztrain {

// `crc` continues an earlier call's result (0 to start).
std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0);
std::uint32_t crc32c_reference(const void* data, std::size_t n, std::uint32_t crc = 0);
// Copies n bytes from src to dst (not overlapping) and returns their
// crc32c, in one pass over them.
std::uint32_t crc32c_copy(void* dst, const void* src, std::size_t n);

}  // namespace ztrain
