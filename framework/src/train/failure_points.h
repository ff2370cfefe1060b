// Failure points: where a test's injected failure (io/fault_plan.h,
// ZTRAIN_TEST_FAIL) is thrown, as a run would meet a real one. Decorators
// around the strategy and the job's communicator throw it when the run,
// in the planned step and on the planned rank, reaches:
//   forward     the strategy's before_forward of the step's first module
//   backward    its before_backward of the first module backward
//   reduce      the step's first all-reduce or reduce-scatter (the
//               gradients': every strategy reduces them before anything
//               else all-reduces in a step)
//   gather      the step's first all-gather (zero3's parameters in forward,
//               zero1/2's updated shards in the optimizer step)
//   optimizer   the strategy's step()
//   checkpoint  its save_state, which a checkpoint of that step calls
// "oom" throws OutOfMemoryError, "error" Error, each naming the point.
// Each fires once. Without an injected failure the run keeps its own
// strategy and communicator (nothing is wrapped).
//
// Thread safety: the trainer's thread (the one that issues collectives).
// Part of the host.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "io/fault_plan.h"
#include "ztrain/comm.h"
#include "ztrain/strategy.h"

namespace ztrain {

class FailurePoints {
 public:
  FailurePoints(InjectedFailure failure, int rank) : failure_(std::move(failure)), rank_(rank) {}
  // The trainer is in `step` (1-based) from now on.
  void set_step(std::int64_t step) { step_ = step; }
  // Throws the injected failure when `where` is its point, in its step, on
  // its rank, the first time.
  void reached(std::string_view where);
  // Says on stderr when the run ended without throwing it on a rank it was
  // planned for: a point the strategy never reaches (ddp's gather) or a
  // step past the run's, which a test would otherwise take for a pass.
  void warn_if_unreached() const;

 private:
  const InjectedFailure failure_;
  const int rank_;
  std::int64_t step_ = 0;
  bool fired_ = false;
};

std::unique_ptr<Communicator> with_failure_points(std::unique_ptr<Communicator> comm,
                                                  std::shared_ptr<FailurePoints> points);
std::shared_ptr<Strategy> with_failure_points(std::shared_ptr<Strategy> strategy,
                                              std::shared_ptr<FailurePoints> points);

}  // namespace ztrain
