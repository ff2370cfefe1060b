// Which tokens of a sequence each rank of a sequence-parallel group holds:
// one definition read by the data loader (which cuts the rows) and the
// model (which gives each token its position).
//
// Thread safety: pure functions. Errors: none; the caller has checked
// that the shards divide the sequence (ulysses_refusal, ring_refusal).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ztrain/export.h"

namespace ztrain {

// How a sequence is split across the S ranks of its group.
enum class SequenceSplit : std::uint8_t {
  // Ulysses (sequence parallelism): rank r holds the r-th of S consecutive
  // slices.
  slices,
  // Ring attention (context parallelism): the sequence is cut into 2S
  // chunks and rank r holds chunks r and 2S-1-r, in that order, so that
  // every rank does the same causal work (ztrain/sequence/ring.h).
  mirrored
};

// Local rows [row, row + length) of a shard are the sequence's positions
// [position, position + length).
struct TokenSpan {
  std::size_t row, position, length;
};

// The spans of shard `shard` of `shards`, each holding `local` tokens of
// every sequence (the whole sequence when shards is 1), in row order.
ZTRAIN_API std::vector<TokenSpan> shard_spans(SequenceSplit split, std::size_t local,
                                              std::size_t shards, std::size_t shard);

}  // namespace ztrain
