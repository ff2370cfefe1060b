#include "train/step_agreement.h"

#include <cstdint>

#include "ztrain/dtype.h"

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

}  // namespace ztrain
