#include "ztrain/sequence/split.h"

namespace ztrain {

std::vector<TokenSpan> shard_spans(SequenceSplit split, std::size_t local, std::size_t shards,
                                   std::size_t shard) {
  if (shards <= 1) return {{0, 0, local}};
  if (split == SequenceSplit::slices) return {{0, shard * local, local}};
  const std::size_t c = local / 2;
  return {{0, shard * c, c}, {c, (2 * shards - 1 - shard) * c, c}};
}

}  // namespace ztrain
