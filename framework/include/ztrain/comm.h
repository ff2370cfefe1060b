// Collective communication between the ranks of a job.
//
// A Communicator connects `size()` ranks. Collectives are called by every
// rank in the same order with matching arguments; buffers live in the memory
// the backend works on (host for mpi, device for nccl). Reduction ops sum,
// average (the average divides the sum by the rank count) or take the
// maximum (a vocabulary-parallel loss's row maxima). Every collective
// has an asynchronous form returning a CommWork: the backend makes progress
// on it while the caller computes, and wait() returns when the buffers may be
// reused. The synchronous forms are the asynchronous ones plus wait().
//
// Failure: a collective that does not finish within the communicator's
// timeout ends the whole job (every rank) with a message naming this rank,
// the operation, its size and the rank that stopped answering: the mpi and
// gloo backends run a watchdog that exchanges heartbeats with rank 0, so
// each rank knows which ranks went silent. A rank that dies ends the job
// through the launcher (mpirun's SIGTERM, on which the survivors say which
// rank went silent) or, on gloo, at once through its closed connections.
// A collective the backend rejects raises CommError. A rank that fails
// (an error it printed) announces it: the other ranks end the job within
// about a second, naming that rank and its message, and the failed rank's
// own teardown waits no longer than that for collectives its peers will
// not finish.
//
// Counting: every communicator counts, per kind of collective, the calls
// that completed and the bytes this rank sent for them. MPI and gloo hide
// their wire, so after each successful call a backend counts what a ring
// algorithm sends for it (for an all-reduce of n bytes over N ranks about
// 2n(N-1)/N, for a reduce-scatter or all-gather about n(N-1)/N; summed
// over the ranks exactly 2n(N-1) and n(N-1)); an all-to-all of N blocks of
// b bytes sends b(N-1) (every block but the rank's own), a permute its b
// bytes unless it passes them to itself; `local` sends nothing. A
// collective that was never issued, or issued twice, shows in the counts.
//
// Backends: `local` (world 1, no MPI: collectives are copies or nothing),
// `mpi` (Open MPI, host memory), `gloo` (ranks started independently,
// torchrun-style, meeting at rank 0's store; gloo's TCP transport, host
// memory) and `nccl` (GPU memory, on the cuda device's communication
// stream; built in libztrain_cuda over an mpi or gloo communicator that
// carries its unique id).
// Thread safety: one thread issues collectives on a communicator; works may
// be waited on from that thread only; counters() may be read from any
// thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ztrain/dtype.h"
#include "ztrain/export.h"

namespace ztrain {

enum class ReduceOp : std::uint8_t { sum, average, max };

// Where a permute sends this rank's block and whence it receives one.
struct Peers {
  int to = 0;
  int from = 0;
};

// The kinds of collective, as they are counted (the irregular forms count
// with their regular kind).
enum class Collective : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  barrier,
  all_to_all,
  permute
};
inline constexpr std::size_t kCollectiveCount = 7;
ZTRAIN_API std::string_view collective_name(Collective c);

// What a rank's collectives moved, per kind: calls completed and bytes this
// rank sent.
struct CommCounters {
  std::array<std::uint64_t, kCollectiveCount> calls{}, bytes_sent{};
  std::uint64_t total_bytes() const {
    std::uint64_t t = 0;
    for (auto b : bytes_sent) t += b;
    return t;
  }
  CommCounters& operator+=(const CommCounters& o) {
    for (std::size_t k = 0; k < kCollectiveCount; ++k) {
      calls[k] += o.calls[k];
      bytes_sent[k] += o.bytes_sent[k];
    }
    return *this;
  }
  // The counts of the interval from `earlier` to this.
  CommCounters since(const CommCounters& earlier) const {
    CommCounters d;
    for (std::size_t k = 0; k < kCollectiveCount; ++k) {
      d.calls[k] = calls[k] - earlier.calls[k];
      d.bytes_sent[k] = bytes_sent[k] - earlier.bytes_sent[k];
    }
    return d;
  }
};

// A pending collective. Default-constructed: already complete.
class ZTRAIN_API CommWork {
 public:
  CommWork() = default;
  // A collective a host thread runs: on_timeout is called (and must not
  // return) when wait() exceeds timeout_s.
  CommWork(std::shared_future<void> done, double timeout_s, std::function<void()> on_timeout)
      : done_(std::move(done)), timeout_s_(timeout_s), on_timeout_(std::move(on_timeout)) {}
  // A collective queued on a GPU stream (nccl): wait() calls `order`, which
  // makes the device's later work wait for it without blocking the host;
  // the backend's own watchdog bounds it.
  explicit CommWork(std::function<void()> order) : order_(std::move(order)) {}
  // Returns when the buffers may be reused: a host collective has finished
  // (its CommError rethrown), or device work issued from now on runs after
  // a device collective.
  void wait();
  // True when wait() would return at once.
  bool test() const;

 private:
  std::shared_future<void> done_;
  double timeout_s_ = 0;
  std::function<void()> on_timeout_;
  std::function<void()> order_;
};

// Waits for every work, even after one failed (their buffers must outlive
// them), then rethrows the first failure.
ZTRAIN_API void wait_all(std::vector<CommWork>& works);

class ZTRAIN_API Communicator {
 public:
  virtual ~Communicator();
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;
  // Bounds every collective submitted from now on (and splits made from
  // now on). The ranks meet before they know the run's
  // [comm] timeout, which rank 0 sends them; they set it then.
  virtual void set_timeout(double timeout_s) = 0;
  // This rank failed with `message`, which it has printed: every other
  // rank is told and ends the job naming it. By default (world 1) there is
  // no one to tell.
  virtual void announce_failure(const std::string& message);

  // In place over count elements.
  virtual CommWork all_reduce_async(void* data, std::size_t count, DType type, ReduceOp op) = 0;
  // send: size() * recv_count elements; rank r receives the reduction of
  // block r.
  virtual CommWork reduce_scatter_async(const void* send, void* recv, std::size_t recv_count,
                                        DType type, ReduceOp op) = 0;
  // recv: size() * send_count elements, rank r's send in block r. send may
  // be the caller's own block of recv (in place).
  virtual CommWork all_gather_async(const void* send, void* recv, std::size_t send_count,
                                    DType type) = 0;
  // The irregular forms: rank r's block holds counts[r] elements, blocks
  // consecutive (send of reduce_scatter_v, recv of all_gather_v); counts has
  // size() entries, equal on every rank. all_gather_v may send from the
  // caller's own block of recv (in place).
  virtual CommWork reduce_scatter_v_async(const void* send, void* recv,
                                          const std::vector<std::size_t>& counts, DType type,
                                          ReduceOp op) = 0;
  virtual CommWork all_gather_v_async(const void* send, void* recv,
                                      const std::vector<std::size_t>& counts, DType type) = 0;
  // root's count elements copied to every rank.
  virtual CommWork broadcast_async(void* data, std::size_t count, DType type, int root) = 0;
  virtual CommWork barrier_async() = 0;
  // send: size() blocks of count elements, block q for rank q; recv: size()
  // blocks of count, block q from rank q (Ulysses trades sequence shards
  // for head shards with it). send and recv do not overlap.
  virtual CommWork all_to_all_async(const void* send, void* recv, std::size_t count,
                                    DType type) = 0;
  // Every rank sends count elements to rank peers.to and receives count
  // from rank peers.from, all at once: the ranks' `to`s are a permutation
  // of the group and each rank's `from` is the rank whose `to` it is (ring
  // attention's pass: to = rank + 1, from = rank - 1, modulo the size).
  // A rank may pass to itself (a copy). send and recv do not overlap. A
  // peer outside the group raises CommError; `to`s that are no permutation
  // are the caller's fault, which a backend may find only by its timeout.
  virtual CommWork permute_async(const void* send, void* recv, std::size_t count, DType type,
                                 Peers peers) = 0;
  // Ranks passing the same colour form a new communicator, ordered by key
  // (then by rank). Collective over this communicator. The new one counts
  // into this one's counters as well as its own.
  virtual std::unique_ptr<Communicator> split(int colour, int key) = 0;
  // Everything completed since this communicator was made, its splits'
  // collectives included.
  virtual CommCounters counters() const = 0;

  void all_reduce(void* data, std::size_t count, DType type, ReduceOp op) {
    all_reduce_async(data, count, type, op).wait();
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                      ReduceOp op) {
    reduce_scatter_async(send, recv, recv_count, type, op).wait();
  }
  void all_gather(const void* send, void* recv, std::size_t send_count, DType type) {
    all_gather_async(send, recv, send_count, type).wait();
  }
  void broadcast(void* data, std::size_t count, DType type, int root) {
    broadcast_async(data, count, type, root).wait();
  }
  void barrier() { barrier_async().wait(); }
  void all_to_all(const void* send, void* recv, std::size_t count, DType type) {
    all_to_all_async(send, recv, count, type).wait();
  }
  void permute(const void* send, void* recv, std::size_t count, DType type, Peers peers) {
    permute_async(send, recv, count, type, peers).wait();
  }
};

ZTRAIN_API std::unique_ptr<Communicator> make_local_communicator();

}  // namespace ztrain
