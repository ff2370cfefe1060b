// Which tokens of a sequence each rank of a sequence-parallel group holds:
// one definition read by the data loader (which cuts the rows) and the
// model (which gives each token its position).
//
// A sequence is split first over the R ranks of a ring (context
// parallelism, ztrain/sequence/ring.h): cut into 2R chunks, ring rank r
// holds chunks r and 2R-1-r, in that order, so that every rank does the
// same causal work. Each ring rank's pair is then split over the S ranks of
// a Ulysses group (sequence parallelism, ztrain/sequence/ulysses.h) into S
// consecutive slices, Ulysses rank k holding the k-th. With R = 1 the pair
// is the whole sequence (Ulysses alone: rank k holds the k-th of S
// slices); with S = 1 a rank holds its pair (the ring alone).
//
// Thread safety: pure functions. Errors: none; the caller has checked
// that the shards divide the sequence (ulysses_refusal, ring_refusal).
#pragma once

#include <cstddef>
#include <vector>

#include "ztrain/export.h"

namespace ztrain {

// The degrees a sequence is split by: Ulysses (`[parallel] sequence`) and
// the ring (`[parallel] context`).
struct SequenceSplit {
  int sequence = 1;
  int context = 1;
  int shards() const { return sequence * context; }
  bool operator==(const SequenceSplit&) const = default;
};

// A rank's place in the split: its rank in the Ulysses group and in the
// ring.
struct SequenceShard {
  int sequence = 0;
  int context = 0;
};

// Local rows [row, row + length) of a shard are the sequence's positions
// [position, position + length).
struct TokenSpan {
  std::size_t row, position, length;
  bool operator==(const TokenSpan&) const = default;
};

// The spans of `shard`, which holds `local` tokens of every sequence (the
// whole sequence when split.shards() is 1), in row order; positions that
// run on are one span.
ZTRAIN_API std::vector<TokenSpan> shard_spans(SequenceSplit split, std::size_t local,
                                              SequenceShard shard);

}  // namespace ztrain
