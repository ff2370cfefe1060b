// The wire form of a heartbeat (watchdog.h), the same on every transport:
// fixed size, so a frame is never mistaken for two on a byte stream, and MPI
// sends it as bytes. A failure's message longer than
// Watchdog::kMaxFailureText bytes is cut at a character boundary and ends
// in "...". Part of the host.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>

#include "comm/watchdog.h"

namespace ztrain {

struct BeatFrame {
  static constexpr std::uint32_t kMagic = 0x7a746864;  // "zthd"
  std::uint32_t magic = kMagic;
  std::uint32_t count = 0;  // silent ranks
  std::int32_t silent[3 * Watchdog::kMaxSilent] = {};
  std::int32_t failed_rank = -1;  // -1: no failure
  std::uint32_t failure_bytes = 0;
  char failure[Watchdog::kMaxFailureText] = {};
};

BeatFrame encode_beat(const Heartbeat& beat);
// nullopt when the frame is not a heartbeat (its magic is wrong).
std::optional<Heartbeat> decode_beat(const BeatFrame& frame);

}  // namespace ztrain
