#include "train/step_agreement.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "ztrain/dtype.h"
#include "ztrain/error.h"

namespace ztrain {

StepAgreement StepAgreement::reach(Communicator& comm, const RankStep& mine) {
  float sums[3] = {mine.loss, mine.stop_requested ? 1.0f : 0.0f, mine.written ? 1.0f : 0.0f};
  comm.all_reduce(sums, 3, DType::f32, ReduceOp::sum);
  const int world = comm.size();
  StepAgreement a;
  a.loss = sums[0] / static_cast<float>(world);
  a.stop = sums[1] > 0.5f;
  a.written_everywhere = static_cast<std::int64_t>(sums[2] + 0.5f) == world;
  return a;
}

std::uint64_t total_over_ranks(Communicator& comm, std::uint64_t mine) {
  const auto world = static_cast<std::size_t>(comm.size());
  float packed[2];
  std::memcpy(packed, &mine, sizeof mine);
  std::vector<float> all(2 * world);
  comm.all_gather(packed, all.data(), 2, DType::f32);
  std::vector<std::uint64_t> counts(world);
  std::memcpy(counts.data(), all.data(), all.size() * sizeof(float));
  std::uint64_t total = 0;
  for (std::uint64_t c : counts) {
    if (c > UINT64_MAX - total) throw InternalError("a count summed over the ranks passes 2^64");
    total += c;
  }
  return total;
}

}  // namespace ztrain
