#include "comm/comm_worker.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "ztrain/error.h"

namespace ztrain {

CommWorker::CommWorker() : thread_([this] { loop(); }) {}

CommWorker::~CommWorker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

std::shared_future<void> CommWorker::submit(std::function<void()> f, std::string what) {
  std::packaged_task<void()> task(std::move(f));
  std::shared_future<void> done = task.get_future().share();
  {
    std::lock_guard lock(mu_);
    queue_.push_back({std::move(task), std::move(what)});
  }
  cv_.notify_one();
  return done;
}

std::optional<std::pair<std::string, CommWorker::Clock::time_point>> CommWorker::running() const {
  std::lock_guard lock(mu_);
  return running_;
}

bool CommWorker::idle() const {
  std::lock_guard lock(mu_);
  return queue_.empty() && !running_;
}

void CommWorker::loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      running_.emplace(task.what, Clock::now());
    }
    task.run();
    std::lock_guard lock(mu_);
    running_.reset();
  }
}

void divide_in_place(void* data, std::size_t count, DType type, int by) {
  if (type == DType::f32) {
    auto* f = static_cast<float*>(data);
    for (std::size_t i = 0; i < count; ++i) f[i] /= static_cast<float>(by);
    return;
  }
  auto* h = static_cast<std::uint16_t*>(data);
  for (std::size_t i = 0; i < count; ++i) {
    const float v =
        (type == DType::bf16 ? bf16_to_float(h[i]) : f16_to_float(h[i])) / static_cast<float>(by);
    h[i] = type == DType::bf16 ? float_to_bf16(v) : float_to_f16(v);
  }
}

ThreadedCommunicator::ThreadedCommunicator(int world_rank, double timeout_s,
                                           std::shared_ptr<CommTally> tally,
                                           std::shared_ptr<Watchdog> watchdog)
    : world_rank_(world_rank),
      timeout_s_(timeout_s),
      tally_(std::move(tally)),
      watchdog_(std::move(watchdog)) {}

CommWork ThreadedCommunicator::submit(const CollectiveCall& call,
                                      std::function<std::uint64_t()> f) {
  // A collective that fails (a peer closed its connection) says what the
  // watchdog knows: the peer may only have given up on a third rank.
  auto run = [tally = tally_, watchdog = watchdog_, kind = call.kind, f = std::move(f)] {
    std::uint64_t sent = 0;
    try {
      sent = f();
    } catch (const CommError& e) {
      if (!watchdog) throw;
      throw CommError(std::string(e.what()) + "; " + watchdog->verdict_after_failure());
    }
    if (kind) tally->record(*kind, sent);
  };
  const std::string what = collective_text(call.op, call.count, call.type);
  const double timeout_s = timeout_s_;
  return CommWork(worker_->submit(std::move(run), what), timeout_s, [this, what, timeout_s] {
    const std::string why = watchdog_
                                ? watchdog_->verdict()
                                : "another rank died, hangs, or issued a different collective";
    char within[32];
    std::snprintf(within, sizeof within, "%g", timeout_s);
    end_job("ztrain: rank " + std::to_string(world_rank_) + ": " + what +
                " did not finish within " + within + " s; " + why + "; aborting the job",
            3);
  });
}

void reduce_into(void* dst, const void* src, std::size_t n, DType type, ReduceOp op) {
  if (op == ReduceOp::max) return max_into(dst, src, n, type);
  add_into(dst, src, n, type);
}

CommWork ThreadedCommunicator::submit_all_reduce(void* data, std::size_t count, DType type,
                                                 ReduceOp op, std::function<void()> run) {
  const int ranks = size();
  const std::uint64_t sent =
      ring_bytes_sent(Collective::all_reduce, even_split(count, ranks), rank(), dtype_size(type));
  return submit({Collective::all_reduce, "all_reduce", count, type}, [=, run = std::move(run)] {
    run();
    if (op == ReduceOp::average) divide_in_place(data, count, type, ranks);
    return sent;
  });
}

CommWork ThreadedCommunicator::submit_reduce_scatter_v(void* recv,
                                                       const std::vector<std::size_t>& counts,
                                                       DType type, ReduceOp op,
                                                       std::function<void()> run) {
  check_block_counts(counts);
  const int ranks = size();
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  const std::size_t own = counts[static_cast<std::size_t>(rank())];
  const std::uint64_t sent =
      ring_bytes_sent(Collective::reduce_scatter, counts, rank(), dtype_size(type));
  return submit({Collective::reduce_scatter, "reduce_scatter_v", total, type},
                [=, run = std::move(run)] {
                  run();
                  if (op == ReduceOp::average) divide_in_place(recv, own, type, ranks);
                  return sent;
                });
}

CommWork ThreadedCommunicator::submit_all_gather_v(const std::vector<std::size_t>& counts,
                                                   DType type, std::function<void()> run) {
  check_block_counts(counts);
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  const std::uint64_t sent =
      ring_bytes_sent(Collective::all_gather, counts, rank(), dtype_size(type));
  return submit_sending({Collective::all_gather, "all_gather_v", total, type}, sent,
                        std::move(run));
}

CommWork ThreadedCommunicator::submit_all_to_all(std::size_t count, DType type,
                                                 std::function<void()> run) {
  const std::uint64_t sent = all_to_all_bytes_sent(count, size(), dtype_size(type));
  return submit_sending(
      {Collective::all_to_all, "all_to_all", count * static_cast<std::size_t>(size()), type}, sent,
      std::move(run));
}

CommWork ThreadedCommunicator::submit_permute(std::size_t count, DType type, Peers peers,
                                              std::function<void()> run) {
  const std::uint64_t sent = permute_bytes_sent(count, dtype_size(type), peers, rank(), size());
  return submit_sending({Collective::permute, "permute", count, type}, sent, std::move(run));
}

CommWork ThreadedCommunicator::submit_sending(const CollectiveCall& call, std::uint64_t sent,
                                              std::function<void()> run) {
  return submit(call, [sent, run = std::move(run)] {
    run();
    return sent;
  });
}

void ThreadedCommunicator::start_guard() {
  if (watchdog_) guard_ = std::thread([this] { guard(); });
}

void ThreadedCommunicator::drain() {
  // What is queued finishes with the guard still watching: a collective a
  // failed or dead peer keeps from finishing ends the job, instead of the
  // worker's join waiting for it forever.
  while (guard_.joinable() && !worker_->idle())
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (guard_.joinable()) {
    {
      std::lock_guard lock(guard_mu_);
      guard_stop_ = true;
    }
    guard_cv_.notify_all();
    guard_.join();
  }
  worker_.reset();
}

void ThreadedCommunicator::guard() {
  FirstSeen seen;
  std::unique_lock lock(guard_mu_);
  while (!guard_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return guard_stop_; })) {
    if (const Ending e = reason_to_end(seen); !e.line.empty()) end_job(e.line, e.code);
  }
}

ThreadedCommunicator::Ending ThreadedCommunicator::reason_to_end(FirstSeen& seen) const {
  using Clock = CommWorker::Clock;
  // A second's grace: a collective may still complete, and a rank that
  // fails the way its peer did (the same refused setting) ends with its
  // own error rather than its peer's.
  constexpr std::chrono::seconds kCannotFinish{1};
  // The failed rank waits longer than its peers' grace, so that they end
  // the job first, each saying which rank failed and why.
  constexpr std::chrono::seconds kAbandon{2};
  const std::string me = "rank " + std::to_string(world_rank_);
  const auto now = Clock::now();
  const auto failed_at = watchdog_->failed_at();
  if (const auto f = watchdog_->peer_failure(); f && !failed_at) {
    if (!seen.peer_failure) seen.peer_failure = now;
    if (now - *seen.peer_failure >= kCannotFinish)
      return {"[" + me + "] ztrain: stopping: rank " + std::to_string(f->rank) +
                  " failed: " + f->message,
              1};
  }
  const auto running = worker_->running();
  const auto stuck_since = [&](Clock::time_point t, Clock::duration d) {
    return running && now - std::max(t, running->second) >= d;
  };
  if (failed_at && stuck_since(*failed_at, kAbandon))
    return {"ztrain: " + me + ": " + running->first +
                " abandoned: this rank failed (above) and the others will not finish it; "
                "ending the job",
            1};
  const std::string lost = watchdog_->closed_peers();
  if (lost.empty()) return {};
  if (!seen.closed_link) seen.closed_link = now;
  if (!stuck_since(*seen.closed_link, kCannotFinish)) return {};
  return {
      "ztrain: " + me + ": " + running->first + " cannot finish: " + lost + "; aborting the job",
      3};
}

void ThreadedCommunicator::end_job(const std::string& line, int code) {
  if (watchdog_ && !watchdog_->claim_ending()) return;
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  abort_job(code);
}

std::uint64_t ThreadedCommunicator::broadcast_sent(std::size_t count, DType type, int root) const {
  if (root < 0 || root >= size())
    throw CommError("broadcast from root " + std::to_string(root) + " in a communicator of " +
                    std::to_string(size()) + " ranks");
  return rank() == root ? count * dtype_size(type) * static_cast<std::uint64_t>(size() - 1) : 0;
}

void ThreadedCommunicator::fail(const char* op, std::size_t count, DType type,
                                const std::string& why) const {
  throw CommError("rank " + std::to_string(world_rank_) + ": " + collective_text(op, count, type) +
                  " failed" + why);
}

void ThreadedCommunicator::check_block_counts(const std::vector<std::size_t>& counts) const {
  if (counts.size() != static_cast<std::size_t>(size()))
    throw CommError("an irregular collective got " + std::to_string(counts.size()) +
                    " block counts for " + std::to_string(size()) + " ranks");
}

}  // namespace ztrain
