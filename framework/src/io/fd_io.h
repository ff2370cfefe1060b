// Whole reads and writes on a file descriptor: the system call repeated
// until every byte has moved (short counts, EINTR), so callers only word
// the error. Part of the host.
// Thread safety: as the descriptor (pread needs no shared offset).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ztrain {

// What read_at returns when the file ends before `bytes` were read.
inline constexpr int kEndOfFile = -1;

// `bytes` bytes at offset `at` into dst: 0, kEndOfFile, or the errno.
int read_at(int fd, void* dst, std::uint64_t bytes, std::uint64_t at);
// `bytes` bytes at the descriptor's offset: 0 or the errno.
int write_all(int fd, const void* src, std::uint64_t bytes);

}  // namespace ztrain
