#include "ztrain/shard/state_ranges.h"

#include <algorithm>
#include <vector>

namespace ztrain::shard {

void put_range(StateSink& sink, const FlatLayout& layout, std::uint64_t begin, std::uint64_t end,
               StateArray a, const float* values) {
  for (const Segment& s : layout.segments(begin, end))
    sink.put(s.param, s.begin - layout.offset(s.param), s.end - s.begin, a,
             values + (s.begin - begin));
}

void get_range(StateSource& source, const FlatLayout& layout, std::uint64_t begin,
               std::uint64_t end, StateArray a, float* out) {
  // Only the padding between parameters is zeroed: a fill of the whole
  // range first would pass over every byte once more than the read does
  // (on resume, a quarter of a warm read's time).
  std::uint64_t at = begin;
  for (const Segment& s : layout.segments(begin, end)) {
    std::fill(out + (at - begin), out + (s.begin - begin), 0.0f);
    source.get(s.param, s.begin - layout.offset(s.param), s.end - s.begin, a,
               out + (s.begin - begin));
    at = s.end;
  }
  std::fill(out + (at - begin), out + (end - begin), 0.0f);
}

namespace {
// Elements staged at a time for state the host cannot reach: 16 MiB.
constexpr std::uint64_t kStageElements = std::uint64_t{1} << 22;
}  // namespace

void put_range(StateSink& sink, const FlatLayout& layout, std::uint64_t begin, std::uint64_t end,
               StateArray a, const float* values, Device& device, Tier tier) {
  if (device.host_visible(tier)) return put_range(sink, layout, begin, end, a, values);
  std::vector<float> stage(std::min(kStageElements, end - begin));
  for (std::uint64_t b = begin; b < end; b += kStageElements) {
    const std::uint64_t e = std::min(end, b + kStageElements);
    device.copy(stage.data(), values + (b - begin), (e - b) * sizeof(float));
    put_range(sink, layout, b, e, a, stage.data());
  }
}

void get_range(StateSource& source, const FlatLayout& layout, std::uint64_t begin,
               std::uint64_t end, StateArray a, float* out, Device& device, Tier tier) {
  if (device.host_visible(tier)) return get_range(source, layout, begin, end, a, out);
  std::vector<float> stage(std::min(kStageElements, end - begin));
  for (std::uint64_t b = begin; b < end; b += kStageElements) {
    const std::uint64_t e = std::min(end, b + kStageElements);
    get_range(source, layout, b, e, a, stage.data());
    device.copy(out + (b - begin), stage.data(), (e - b) * sizeof(float));
  }
}

void ClippedSink::put(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
                      const float* values) {
  const std::uint64_t at = layout_.offset(p) + first;  // the put's flat start
  const std::uint64_t lo = std::max(at, begin_), hi = std::min(at + count, end_);
  if (lo < hi) sink_.put(p, first + (lo - at), hi - lo, a, values + (lo - at));
}

}  // namespace ztrain::shard
