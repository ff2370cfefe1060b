#include "ztrain/shard/state_ranges.h"

#include <algorithm>

namespace ztrain::shard {

void put_range(StateSink& sink, const FlatLayout& layout, std::uint64_t begin, std::uint64_t end,
               StateArray a, const float* values) {
  for (const Segment& s : layout.segments(begin, end))
    sink.put(s.param, s.begin - layout.offset(s.param), s.end - s.begin, a,
             values + (s.begin - begin));
}

void get_range(StateSource& source, const FlatLayout& layout, std::uint64_t begin,
               std::uint64_t end, StateArray a, float* out) {
  std::fill(out, out + (end - begin), 0.0f);
  for (const Segment& s : layout.segments(begin, end))
    source.get(s.param, s.begin - layout.offset(s.param), s.end - s.begin, a,
               out + (s.begin - begin));
}

}  // namespace ztrain::shard
