// What every communicator backend shares, the host's (mpi, gloo, local) and
// the CUDA backend's (nccl) alike: the counters behind
// Communicator::counters() and the words its messages use.
//
// CommTally: a backend records each collective when it completes, with the
// bytes this rank sent for it; a communicator made by split() records into
// its parent's tally too, so the world's counters cover every group.
// ring_bytes_sent is what a ring algorithm sends from `rank`, for backends
// that cannot count their wire themselves (mpi, gloo).
// Thread safety: record and snapshot from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include <optional>
#include <string>

#include "kit/kit_export.h"
#include "ztrain/comm.h"
#include "ztrain/dtype.h"

namespace ztrain {

class ZTRAIN_KIT CommTally {
 public:
  explicit CommTally(std::shared_ptr<CommTally> parent = nullptr) : parent_(std::move(parent)) {}
  void record(Collective kind, std::uint64_t bytes_sent);
  CommCounters snapshot() const;

 private:
  std::shared_ptr<CommTally> parent_;
  std::array<std::atomic<std::uint64_t>, kCollectiveCount> calls_{}, bytes_{};
};

// Bytes a ring all-reduce, reduce-scatter or all-gather sends from `rank`,
// given the elements of every rank's block (an all-reduce's blocks are
// even_split of its buffer): the reduce-scatter passes on every block but
// the rank's own, the all-gather every block but the next rank's, and the
// all-reduce does both.
ZTRAIN_KIT std::uint64_t ring_bytes_sent(Collective kind, const std::vector<std::size_t>& counts,
                                         int rank, std::size_t element_size);
// Bytes an all-to-all of `count` elements per block sends from a rank of a
// group of `ranks`: every block but the rank's own.
ZTRAIN_KIT std::uint64_t all_to_all_bytes_sent(std::size_t count, int ranks,
                                               std::size_t element_size);
// Bytes a permute of `count` elements sends from `rank` (none when it
// passes to itself); CommError naming both peers when either lies outside
// a group of `ranks`.
ZTRAIN_KIT std::uint64_t permute_bytes_sent(std::size_t count, std::size_t element_size,
                                            Peers peers, int rank, int ranks);
// The ring's blocks of an n-element all-reduce over `ranks`: n / ranks each,
// the first n % ranks one more.
ZTRAIN_KIT std::vector<std::size_t> even_split(std::size_t n, int ranks);

// What messages call a collective: "all_reduce of 1001 f32 elements".
ZTRAIN_KIT std::string collective_text(const char* op, std::size_t count, DType type);

// A collective as a backend runs it: its kind (nothing is counted without
// one: split is set-up, not traffic) and what its messages call it.
struct CollectiveCall {
  std::optional<Collective> kind;
  const char* op;
  std::size_t count;
  DType type;
};

}  // namespace ztrain
