#include "job/job_figures.h"

#include <algorithm>
#include <vector>

namespace ztrain {

namespace {
// One rank's figures as a row of integers: category peaks, tier peaks,
// then bytes per collective kind.
constexpr std::size_t kPeaks = kTierCount * kCategoryCount + kTierCount;
constexpr std::size_t kRow = kPeaks + kCollectiveCount;

// The row's slots: tier t's category c, then tier t's total.
std::size_t slot(Tier t, Category c) {
  return static_cast<std::size_t>(t) * kCategoryCount + static_cast<std::size_t>(c);
}
std::size_t slot(Tier t) {
  return kTierCount * kCategoryCount + static_cast<std::size_t>(t);
}

}  // namespace

JobFigures gather_job_figures(Communicator& comm, const MemoryStats& memory,
                              const CommCounters& traffic) {
  JobFigures f;
  f.ranks = comm.size();
  f.comm = traffic;
  f.memory.peak = memory.peak;
  f.memory.tier_peak = memory.tier_peak;
  if (comm.size() == 1) return f;
  std::vector<std::uint64_t> all(kRow * static_cast<std::size_t>(comm.size()));
  std::uint64_t* own = all.data() + kRow * static_cast<std::size_t>(comm.rank());
  for (Tier t : kTiers) {
    for (Category c : kCategories) own[slot(t, c)] = memory.peak[t][c];
    own[slot(t)] = memory.tier_peak[t];
  }
  for (std::size_t k = 0; k < kCollectiveCount; ++k) own[kPeaks + k] = traffic.bytes_sent[k];
  // A 16-bit dtype only sets the element size here: all-gather moves bits.
  comm.all_gather(own, all.data(), kRow * 4, DType::bf16);
  f.comm.bytes_sent = {};
  for (int r = 0; r < comm.size(); ++r) {
    const std::uint64_t* theirs = all.data() + kRow * static_cast<std::size_t>(r);
    for (Tier t : kTiers) {
      for (Category c : kCategories)
        f.memory.peak[t][c] = std::max(f.memory.peak[t][c], theirs[slot(t, c)]);
      f.memory.tier_peak[t] = std::max(f.memory.tier_peak[t], theirs[slot(t)]);
    }
    for (std::size_t k = 0; k < kCollectiveCount; ++k) f.comm.bytes_sent[k] += theirs[kPeaks + k];
  }
  return f;
}

}  // namespace ztrain
