#include "kernels/cpu/adamw_runs.h"

#include <algorithm>
#include <cstring>

namespace ztrain {

std::vector<AdamWChunk> adamw_chunks(const AdamWRun* runs, std::size_t count, std::uint64_t chunk) {
  std::vector<AdamWChunk> chunks;
  for (std::size_t r = 0; r < count; ++r)
    for (std::uint64_t b = runs[r].begin; b < runs[r].end; b += chunk)
      chunks.push_back({b, std::min(runs[r].end, b + chunk), runs[r].decay});
  return chunks;
}

void zero_runs(TypedPtr g, const AdamWRun* runs, std::size_t count) {
  const std::size_t size = dtype_size(g.dtype);
  for (std::size_t r = 0; r < count; ++r)
    std::memset(g.at(runs[r].begin).data, 0, (runs[r].end - runs[r].begin) * size);
}

}  // namespace ztrain
