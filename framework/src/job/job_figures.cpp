#include "job/job_figures.h"

#include <algorithm>
#include <vector>

namespace ztrain {

namespace {
// One rank's figures as a row of integers: category peaks, tier peaks,
// then bytes per collective kind.
constexpr std::size_t kPeaks = kTierCount * kCategoryCount + kTierCount;
constexpr std::size_t kRow = kPeaks + kCollectiveCount;
}  // namespace

JobFigures gather_job_figures(Communicator& comm, const MemoryStats& memory,
                              const CommCounters& traffic) {
  JobFigures f;
  f.ranks = comm.size();
  f.comm = traffic;
  for (std::size_t t = 0; t < kTierCount; ++t) {
    f.memory.peak[t] = memory.peak[t];
    f.memory.tier_peak[t] = memory.tier_peak[t];
  }
  if (comm.size() == 1) return f;
  std::vector<std::uint64_t> all(kRow * static_cast<std::size_t>(comm.size()));
  std::uint64_t* own = all.data() + kRow * static_cast<std::size_t>(comm.rank());
  for (std::size_t t = 0; t < kTierCount; ++t) {
    for (std::size_t c = 0; c < kCategoryCount; ++c)
      own[t * kCategoryCount + c] = memory.peak[t][c];
    own[kTierCount * kCategoryCount + t] = memory.tier_peak[t];
  }
  for (std::size_t k = 0; k < kCollectiveCount; ++k) own[kPeaks + k] = traffic.bytes_sent[k];
  // A 16-bit dtype only sets the element size here: all-gather moves bits.
  comm.all_gather(own, all.data(), kRow * 4, DType::bf16);
  f.comm.bytes_sent = {};
  for (int r = 0; r < comm.size(); ++r) {
    const std::uint64_t* theirs = all.data() + kRow * static_cast<std::size_t>(r);
    for (std::size_t t = 0; t < kTierCount; ++t) {
      for (std::size_t c = 0; c < kCategoryCount; ++c)
        f.memory.peak[t][c] = std::max(f.memory.peak[t][c], theirs[t * kCategoryCount + c]);
      f.memory.tier_peak[t] =
          std::max(f.memory.tier_peak[t], theirs[kTierCount * kCategoryCount + t]);
    }
    for (std::size_t k = 0; k < kCollectiveCount; ++k) f.comm.bytes_sent[k] += theirs[kPeaks + k];
  }
  return f;
}

}  // namespace ztrain
