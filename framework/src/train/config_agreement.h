// Every rank of a job must run the same configuration.
//
// Ranks are started separately (mpirun, torchrun-style environment, a
// scheduler), each reading its own run file, presets and --set overrides;
// when those differ, the ranks would train different models or schedules
// and still exit 0. check_ranks_agree compares a digest of every resolved
// key and value across the ranks right after they meet, before anything
// is built, and on a mismatch raises the same ConfigError on every rank,
// naming the first key that differs and its value (and origin) on rank 0
// and on the first rank that differs.
//
// stop_together makes the checks one rank (or one host) makes before
// training (or the parts of a checkpoint) stop every rank: each passes its
// own reason (empty: none), and when any rank has one, every rank raises
// the error, its own reason or `others` where it had none, instead of some
// ranks going on into collectives the refusing ones never join.
//
// Thread safety: collective; the training thread only.
#pragma once

#include <string>

#include "core/config.h"
#include "ztrain/comm.h"
#include "ztrain/error.h"

namespace ztrain {

void check_ranks_agree(const RunConfig& config, Communicator& comm);
// Whether any rank passes true (every rank learns the same answer).
bool any_rank(bool mine, Communicator& comm);
// E: the error every rank raises (a refused configuration by default; a
// checkpoint that could not be written raises DataError).
template <class E = ConfigError>
void stop_together(const std::string& why, const std::string& others, Communicator& comm) {
  if (any_rank(!why.empty(), comm)) throw E(why.empty() ? others : why);
}

}  // namespace ztrain
