#include "train/step_agreement.h"

#include <cstdint>

#include "job/rank_agreement.h"
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
  std::uint64_t total = 0;
  for (std::uint64_t c : every_rank_count(mine, comm)) {
    if (c > UINT64_MAX - total) throw InternalError("a count summed over the ranks passes 2^64");
    total += c;
  }
  return total;
}

}  // namespace ztrain
