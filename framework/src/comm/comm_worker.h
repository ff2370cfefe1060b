// What the mpi and tcp communicators share: the worker thread that runs
// their collectives in submission order (so they progress while the caller
// computes), the in-place division of an average, and the CommWork whose
// timeout ends the process with a message naming the rank and operation.
// Internal to libztrain.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

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

// Submits f to the worker; past timeout_s, waiting on the result prints
// "rank R: OP of N DTYPE elements did not finish ..." and calls abort_job,
// which must not return.
CommWork submit_collective(CommWorker& worker, int rank, double timeout_s, const char* op,
                           std::size_t count, DType type, std::function<void()> f,
                           std::function<void()> abort_job);

}  // namespace ztrain
