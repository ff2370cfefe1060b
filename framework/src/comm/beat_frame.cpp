#include "comm/beat_frame.h"

#include <algorithm>
#include <cstring>
#include <string_view>

namespace ztrain {
namespace {

// The longest prefix of `text` within `limit` bytes that does not end
// inside a UTF-8 character, with "..." when it had to cut.
std::string_view cut(std::string_view text, std::size_t limit, bool& was_cut) {
  was_cut = text.size() > limit;
  if (!was_cut) return text;
  std::size_t n = limit - 3;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return text.substr(0, n);
}

}  // namespace

BeatFrame encode_beat(const Heartbeat& beat) {
  BeatFrame f;
  f.count = static_cast<std::uint32_t>(std::min(beat.silent.size(), Watchdog::kMaxSilent));
  for (std::size_t k = 0; k < f.count; ++k) {
    f.silent[3 * k] = beat.silent[k].rank;
    f.silent[3 * k + 1] = beat.silent[k].silent_ms;
    f.silent[3 * k + 2] = beat.silent[k].closed;
  }
  if (!beat.failure) return f;
  f.failed_rank = beat.failure->rank;
  bool was_cut = false;
  const std::string_view text = cut(beat.failure->message, sizeof f.failure, was_cut);
  std::memcpy(f.failure, text.data(), text.size());
  f.failure_bytes = static_cast<std::uint32_t>(text.size());
  if (was_cut) {
    std::memcpy(f.failure + text.size(), "...", 3);
    f.failure_bytes += 3;
  }
  return f;
}

std::optional<Heartbeat> decode_beat(const BeatFrame& f) {
  if (f.magic != BeatFrame::kMagic) return std::nullopt;
  Heartbeat beat;
  for (std::uint32_t k = 0; k < f.count && k < Watchdog::kMaxSilent; ++k)
    beat.silent.push_back({f.silent[3 * k], f.silent[3 * k + 1], f.silent[3 * k + 2]});
  if (f.failed_rank >= 0)
    beat.failure = RankFailure{
        f.failed_rank,
        std::string(f.failure, std::min<std::size_t>(f.failure_bytes, sizeof f.failure))};
  return beat;
}

}  // namespace ztrain
