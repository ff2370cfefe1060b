// Byte sizes and durations as people write them.
//
// parse_size accepts plain numbers ("5e8", "1024") and suffixed strings with
// binary ("KiB", "MiB", "GiB", "TiB") or decimal ("KB", "MB", "GB", "TB")
// units, plus a bare "B"; parse_duration accepts "300s", "5m", "1h", "250ms"
// or a number of seconds. Both raise ConfigError naming the text and the
// accepted forms. format_bytes prints with binary units ("1.50 GiB");
// counted a count with its noun ("1 step", "2 steps").
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ztrain/export.h"

namespace ztrain {

ZTRAIN_API std::uint64_t parse_size(std::string_view text);
ZTRAIN_API std::uint64_t size_from_number(double value);
ZTRAIN_API double parse_duration(std::string_view text);
ZTRAIN_API std::string format_bytes(std::uint64_t bytes);
// n and `noun` ("step"), its plural made with an "s".
inline std::string counted(std::int64_t n, std::string_view noun) {
  return std::to_string(n) + " " + std::string(noun) + (n == 1 ? "" : "s");
}

}  // namespace ztrain
