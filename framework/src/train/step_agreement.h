// StepAgreement: what the ranks agree on after each optimizer step, in one
// all-reduce: the loss averaged over ranks, whether any rank was asked to
// stop (a signal reaches ranks at different moments; all stop at the same
// step), and whether every rank has finished writing its part of the
// checkpoint in flight (it is committed at the first step after).
//
// Encoding: one f32 sum of [loss, stop, written]. The flags are 0/1 per
// rank, so their sums are counts, exact in f32 for any world below 2^24
// ranks: any rank stopping is a count above 0, every rank written is a
// count equal to the world. The loss sum is divided by the world in f32,
// the same rounding as the communicators' average, so a world-1 run's loss
// is its rank's loss bit for bit.
//
// total_over_ranks: the sum of one count per rank (a step's trained tokens),
// exact at any size (job/rank_agreement.h's every_rank_count, summed as
// integers).
//
// Errors: CommError from the collectives; InternalError for a sum past
// 2^64. Thread safety: the training thread.
#pragma once

#include <cstdint>

#include "ztrain/comm.h"

namespace ztrain {

// What one rank brings to the agreement.
struct RankStep {
  float loss = 0;  // this rank's mean loss over its micro-batches
  bool stop_requested = false;
  bool written = true;  // its checkpoint part is written (or none is in flight)
};

struct StepAgreement {
  double loss = 0;    // the mean over ranks
  bool stop = false;  // some rank was asked to stop
  bool written_everywhere = true;

  // Collective: every rank calls it after each optimizer step.
  static StepAgreement reach(Communicator& comm, const RankStep& mine);
};

std::uint64_t total_over_ranks(Communicator& comm, std::uint64_t mine);

}  // namespace ztrain
