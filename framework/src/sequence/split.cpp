#include "ztrain/sequence/split.h"

#include <algorithm>

namespace ztrain {

// The Ulysses slice is rows [k L, (k+1) L) of the ring rank's pair of
// chunks, c = S L / 2 rows each: its part in each chunk, at that chunk's
// positions, joined where they meet.
std::vector<TokenSpan> shard_spans(SequenceSplit split, std::size_t local, SequenceShard shard) {
  const auto S = static_cast<std::size_t>(split.sequence),
             R = static_cast<std::size_t>(split.context),
             k = static_cast<std::size_t>(shard.sequence),
             r = static_cast<std::size_t>(shard.context);
  if (R == 1) return {{0, k * local, local}};  // no chunks: the pair is the sequence
  const std::size_t c = S * local / 2, from = k * local, to = from + local;
  const std::size_t chunk_at[2] = {r * c, (2 * R - 1 - r) * c};
  std::vector<TokenSpan> spans;
  for (std::size_t half = 0; half < 2; ++half) {
    const std::size_t lo = std::max(from, half * c), hi = std::min(to, (half + 1) * c);
    if (lo >= hi) continue;
    const TokenSpan s{lo - from, chunk_at[half] + lo - half * c, hi - lo};
    if (!spans.empty() && spans.back().position + spans.back().length == s.position)
      spans.back().length += s.length;
    else
      spans.push_back(s);
  }
  return spans;
}

}  // namespace ztrain
