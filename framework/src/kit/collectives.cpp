#include "kit/collectives.h"

#include <numeric>

#include "ztrain/error.h"

namespace ztrain {

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::all_gather:
      return "all_gather";
    case Collective::broadcast:
      return "broadcast";
    case Collective::barrier:
      return "barrier";
    case Collective::all_to_all:
      return "all_to_all";
    case Collective::permute:
      return "permute";
  }
  return "?";
}

void CommTally::record(Collective kind, std::uint64_t bytes_sent) {
  const auto k = static_cast<std::size_t>(kind);
  calls_[k].fetch_add(1, std::memory_order_relaxed);
  bytes_[k].fetch_add(bytes_sent, std::memory_order_relaxed);
  if (parent_) parent_->record(kind, bytes_sent);
}

CommCounters CommTally::snapshot() const {
  CommCounters c;
  for (std::size_t k = 0; k < kCollectiveCount; ++k) {
    c.calls[k] = calls_[k].load(std::memory_order_relaxed);
    c.bytes_sent[k] = bytes_[k].load(std::memory_order_relaxed);
  }
  return c;
}

std::vector<std::size_t> even_split(std::size_t n, int ranks) {
  const auto r = static_cast<std::size_t>(ranks);
  std::vector<std::size_t> c(r, n / r);
  for (std::size_t i = 0; i < n % r; ++i) ++c[i];
  return c;
}

std::uint64_t ring_bytes_sent(Collective kind, const std::vector<std::size_t>& counts, int rank,
                              std::size_t element_size) {
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  const std::size_t n = counts.size(), r = static_cast<std::size_t>(rank);
  const std::uint64_t reduce = total - counts[r], gather = total - counts[(r + 1) % n];
  switch (kind) {
    case Collective::all_reduce:
      return (reduce + gather) * element_size;
    case Collective::reduce_scatter:
      return reduce * element_size;
    case Collective::all_gather:
      return gather * element_size;
    case Collective::broadcast:
    case Collective::barrier:
    case Collective::all_to_all:
    case Collective::permute:
      break;
  }
  throw InternalError("ring_bytes_sent: " + std::string(collective_name(kind)) + " is no ring");
}

std::uint64_t all_to_all_bytes_sent(std::size_t count, int ranks, std::size_t element_size) {
  return std::uint64_t{count} * element_size * static_cast<std::uint64_t>(ranks - 1);
}

std::uint64_t permute_bytes_sent(std::size_t count, std::size_t element_size, Peers peers, int rank,
                                 int ranks) {
  for (int peer : {peers.to, peers.from})
    if (peer < 0 || peer >= ranks)
      throw CommError("rank " + std::to_string(rank) + ": permute between rank " +
                      std::to_string(peers.from) + " (from) and rank " + std::to_string(peers.to) +
                      " (to) in a group of " + std::to_string(ranks) +
                      " ranks; both must be ranks of the group (0 to " + std::to_string(ranks - 1) +
                      ")");
  if ((peers.to == rank) != (peers.from == rank))
    throw CommError("rank " + std::to_string(rank) + ": permute to rank " +
                    std::to_string(peers.to) + " from rank " + std::to_string(peers.from) +
                    "; a rank that passes to itself receives from itself, and only then");
  return peers.to == rank ? 0 : std::uint64_t{count} * element_size;
}

std::string collective_text(const char* op, std::size_t count, DType type) {
  return std::string(op) + " of " + std::to_string(count) + " " + std::string(dtype_name(type)) +
         " elements";
}

}  // namespace ztrain
