// What the mpi and tcp communicators share: the worker thread that runs
// their collectives in submission order (so they progress while the caller
// computes), the in-place division of an average, and the CommWork whose
// timeout ends the process with a message naming the rank and operation,
// and which records the collective in the tally when it completes.
// Internal to libztrain.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "comm/comm_tally.h"
#include "ztrain/comm.h"
#include "ztrain/dtype.h"

namespace ztrain {

// Runs submitted tasks one at a time, in submission order, on its own
// thread; the destructor finishes what is queued.
class CommWorker {
 public:
  CommWorker();
  ~CommWorker();
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;
  std::shared_future<void> submit(std::function<void()> f);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// data[i] /= by, in the dtype (16-bit values through fp32).
void divide_in_place(void* data, std::size_t count, DType type, int by);

// Submits f to the worker; f returns the bytes it sent, which are recorded
// in the tally under `kind` when f succeeds (nothing is recorded without a
// kind: split is set-up, not traffic). Past timeout_s, waiting on the
// result prints "rank R: OP of N DTYPE elements did not finish ..." and
// calls abort_job, which must not return.
struct CollectiveCall {
  std::optional<Collective> kind;
  const char* op;
  std::size_t count;
  DType type;
};
CommWork submit_collective(CommWorker& worker, CommTally& tally, int rank, double timeout_s,
                           const CollectiveCall& call, std::function<std::uint64_t()> f,
                           std::function<void()> abort_job);

}  // namespace ztrain
