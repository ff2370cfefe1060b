// How the cpu kernels step a shard's AdamW runs: one parallel loop over
// fixed-size chunks of every run (a loop per run would pay the scheduling
// of a parallel loop for each bias and norm vector), and the gradients
// zeroed run by run when the step is skipped.
//
// Thread safety: pure functions of their arguments (zero_runs writes g).
#pragma once

#include <cstdint>
#include <vector>

#include "ztrain/kernels.h"

namespace ztrain {

// A chunk of one run: elements [begin, end) of the shard.
struct AdamWChunk {
  std::uint64_t begin, end;
  bool decay;
};

// Each run cut into chunks of at most `chunk` elements, starting at the
// run's first element (chunk is a multiple of 8, so a vector loop sees the
// same 8-element groups however the shard is cut).
std::vector<AdamWChunk> adamw_chunks(const AdamWRun* runs, std::size_t count, std::uint64_t chunk);

// g = 0 over every run (a skipped step).
void zero_runs(TypedPtr g, const AdamWRun* runs, std::size_t count);

}  // namespace ztrain
