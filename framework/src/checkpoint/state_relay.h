// Loading a strategy's state on ranks that cannot read its source (a host
// without the weights file or the checkpoint), through rank 0, which can.
//
// Every rank runs the strategy's load_state twice (a strategy may run its
// own collectives inside it, so no rank can skip it). The first time, the
// source only records the ranges each rank's strategy asks for; rank 0
// learns them and sends each other rank exactly those elements, read from
// its own source, in bounded rounds; each rank keeps them in an anonymous
// scratch file in TMPDIR, so no rank holds more than a round in memory.
// The second time, the source hands them back from there.
//
// Errors: DataError on every rank when a rank cannot keep what it
// receives (naming the host and directory); InternalError when a
// strategy's second load_state asks for other ranges than its first.
// Thread safety: collective; the training thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "ztrain/comm.h"
#include "ztrain/optimizer_state.h"
#include "ztrain/strategy.h"

namespace ztrain {

// What fills from a state source: Strategy::load_state, or more.
using StateLoader = std::function<void(StateSource&)>;

// `source`: rank 0's (the others pass nullptr). With `master_only`, m and v
// do not travel and the receiving ranks load zeros for them (a fresh
// optimizer). `what` names the state in messages ("init_from").
// Returns the bytes the relay moved between ranks, summed over them.
// `load` hands a source to what fills from it (Strategy::load_state), and
// is called twice: once to record the ranges it reads, once to read them.
std::uint64_t load_through_rank_0(const StateLoader& load, StateSource* source, bool master_only,
                                  const std::string& what, Communicator& comm);

}  // namespace ztrain
