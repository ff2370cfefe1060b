// Shared by the fuzz targets: the input as text or as a file, and the rule
// for what a target may throw.
//
// A target feeds one input to one parser of ztrain's. Errors of ztrain's own
// hierarchy (ConfigError, DataError, ...) are the expected answer to a bad
// input; anything else escaping (std::out_of_range, bad_alloc, a crash, a
// sanitizer report) is a finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "ztrain/error.h"

namespace ztrain::fuzz {

inline std::string text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The input written to a file of this process (memory-backed where /dev/shm
// is), replaced on every call.
inline std::filesystem::path as_file(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path path =
      (std::filesystem::is_directory("/dev/shm") ? std::filesystem::path("/dev/shm")
                                                 : std::filesystem::temp_directory_path()) /
      ("ztrain-fuzz-" + std::to_string(::getpid()));
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

// Runs f; ztrain's errors are answers, everything else propagates.
template <class F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const ztrain::Error&) {
  }
}

}  // namespace ztrain::fuzz
