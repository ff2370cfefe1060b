// What the mpi and gloo communicators share: a worker thread that runs their
// collectives in submission order (so they progress while the caller
// computes), the in-place division of an average, the counting of each
// completed collective, and the CommWork whose timeout ends the job with a
// message naming the rank, the operation and, from the watchdog, the rank
// that stopped answering. Part of the host.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/watchdog.h"
#include "kit/collectives.h"
#include "ztrain/comm.h"
#include "ztrain/dtype.h"

namespace ztrain {

// Runs submitted tasks one at a time, in submission order, on its own
// thread; the destructor finishes what is queued.
class CommWorker {
 public:
  using Clock = std::chrono::steady_clock;
  CommWorker();
  ~CommWorker();
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;
  // `what` names the task while it runs (running()).
  std::shared_future<void> submit(std::function<void()> f, std::string what);
  // The task running, and since when; nullopt while idle.
  std::optional<std::pair<std::string, Clock::time_point>> running() const;
  // Nothing queued and nothing running.
  bool idle() const;

 private:
  struct Task {
    std::packaged_task<void()> run;
    std::string what;
  };
  void loop();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::optional<std::pair<std::string, Clock::time_point>> running_;
  bool stop_ = false;
  std::thread thread_;
};

// How much longer than [comm] timeout a backend's own waits run, so that the
// CommWork's timeout fires first with the standard message and the
// watchdog's verdict; the backend's own only frees its worker.
constexpr std::chrono::milliseconds kTransportGrace{10000};

// data[i] /= by, in the dtype (16-bit values through fp32).
void divide_in_place(void* data, std::size_t count, DType type, int by);

// One step of a reduction by `op`: dst[i] += src[i] (sum, and average,
// which divide_in_place finishes), or dst[i] = max(dst[i], src[i]).
void reduce_into(void* dst, const void* src, std::size_t n, DType type, ReduceOp op);

// The base of the mpi and gloo communicators. A subclass must call
// drain() first in its destructor: queued tasks use its members.
class ThreadedCommunicator : public Communicator {
 public:
  CommCounters counters() const override { return tally_->snapshot(); }
  void set_timeout(double timeout_s) override { timeout_s_ = timeout_s; }
  void announce_failure(const std::string& message) override {
    if (watchdog_) watchdog_->announce_failure(message);
  }
  // The regular forms as the irregular ones with equal blocks (a backend
  // with its own regular collectives, mpi, overrides them).
  CommWork reduce_scatter_async(const void* send, void* recv, std::size_t count, DType type,
                                ReduceOp op) override {
    return reduce_scatter_v_async(send, recv, blocks(count), type, op);
  }
  CommWork all_gather_async(const void* send, void* recv, std::size_t count, DType type) override {
    return all_gather_v_async(send, recv, blocks(count), type);
  }
  // What hears the other ranks' heartbeats (gloo's); null for mpi.
  std::shared_ptr<Watchdog> watchdog() const { return watchdog_; }

 protected:
  // world_rank names this process in messages; watchdog may be null.
  ThreadedCommunicator(int world_rank, double timeout_s, std::shared_ptr<CommTally> tally,
                       std::shared_ptr<Watchdog> watchdog);
  // Runs f on the worker; f returns the bytes it sent, recorded under the
  // call's kind when f succeeds; a CommError it raises gets the watchdog's
  // verdict appended. Past the timeout, waiting on the work
  // prints "ztrain: rank R: OP of N DTYPE elements did not finish within T
  // s; VERDICT; aborting the job" and calls abort_job(3).
  CommWork submit(const CollectiveCall& call, std::function<std::uint64_t()> f);
  // submit() for a backend whose transport is `run`, with the bookkeeping
  // every backend shares: the blocks checked, the bytes a ring sends, an
  // average's division of the sum once run returns.
  CommWork submit_all_reduce(void* data, std::size_t count, DType type, ReduceOp op,
                             std::function<void()> run);
  CommWork submit_reduce_scatter_v(void* recv, const std::vector<std::size_t>& counts, DType type,
                                   ReduceOp op, std::function<void()> run);
  CommWork submit_all_gather_v(const std::vector<std::size_t>& counts, DType type,
                               std::function<void()> run);
  // The same for the exchanges: the bytes each sends, and a permute's
  // peers checked (CommError) before anything is queued.
  CommWork submit_all_to_all(std::size_t count, DType type, std::function<void()> run);
  CommWork submit_permute(std::size_t count, DType type, Peers peers, std::function<void()> run);
  // submit() of a transport `run` that sends `sent` bytes, known before it
  // runs.
  CommWork submit_sending(const CollectiveCall& call, std::uint64_t sent,
                          std::function<void()> run);
  // Ends every rank of the job, this one with exit status `code`; must not
  // return.
  virtual void abort_job(int code) = 0;
  // Starts the guard (a subclass's constructor, once it can abort_job).
  void start_guard();
  // Checks a broadcast's root (CommError when outside the communicator);
  // the bytes this rank sends for it: the root one copy to each other rank.
  std::uint64_t broadcast_sent(std::size_t count, DType type, int root) const;
  // The bound of the backend's own waits: the timeout plus kTransportGrace.
  std::chrono::milliseconds transport_timeout() const {
    return std::chrono::milliseconds(static_cast<long long>(timeout_s_ * 1000)) + kTransportGrace;
  }
  // Every rank's block of a regular collective: size() blocks of count.
  std::vector<std::size_t> blocks(std::size_t count) const {
    return std::vector<std::size_t>(static_cast<std::size_t>(size()), count);
  }
  // Checks that an irregular collective has one block count per rank.
  void check_block_counts(const std::vector<std::size_t>& counts) const;
  // Raises "rank R: OP of N DTYPE elements failed<why>".
  [[noreturn]] void fail(const char* op, std::size_t count, DType type,
                         const std::string& why) const;
  // Waits for what is queued (the guard still ending the job when a
  // collective cannot finish), then stops the guard and the worker.
  void drain();

  int world_rank_;
  std::atomic<double> timeout_s_;  // read by the worker thread (gloo's deadlines)
  std::shared_ptr<CommTally> tally_;
  std::shared_ptr<Watchdog> watchdog_;

 private:
  // The guard's thread, every 100 ms. Another rank announced a failure
  // (and this one has not, a second later): the job ends with that rank's
  // message.
  // This rank announced one: a collective still running two seconds after
  // that will not finish (its peers are ending), so the job ends then. A
  // collective still running a second after the watchdog heard a peer's
  // link close cannot finish either (gloo may wait for a dead peer up to
  // its own timeout): the job ends then, naming both. Each instead of at
  // [comm] timeout.
  void guard();
  // The guard's reason to end the job now: the line to print (empty while
  // there is none) and the exit status. `seen`: when the guard first saw a
  // closed link and a peer's failure.
  struct Ending {
    std::string line;
    int code = 0;
  };
  struct FirstSeen {
    std::optional<CommWorker::Clock::time_point> closed_link, peer_failure;
  };
  Ending reason_to_end(FirstSeen& seen) const;
  // Prints `line` and calls abort_job(code), unless another of the job's
  // communicators is ending it already (then waits for that).
  void end_job(const std::string& line, int code);

  std::unique_ptr<CommWorker> worker_ = std::make_unique<CommWorker>();
  std::mutex guard_mu_;
  std::condition_variable guard_cv_;
  bool guard_stop_ = false;
  std::thread guard_;
};

}  // namespace ztrain
