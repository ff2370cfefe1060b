// The communicators' guard: a collective that cannot finish because a peer
// died (the watchdog heard its link close) ends the job within about a
// second, naming the collective and the peer, instead of at [comm]
// timeout; an idle communicator beside a peer that has left (the end of a
// job) is left alone. A fake transport stands for the heartbeat links and
// a collective that never returns for gloo waiting on a dead peer.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "comm/comm_worker.h"
#include "comm/watchdog.h"

using namespace ztrain;

namespace {

using std::chrono::milliseconds;

// Rank 1's heartbeat link to rank 0 closes at once.
class ClosedPeer final : public Watchdog::Transport {
 public:
  void beat(int, const std::vector<SilentRank>&) override {}
  std::vector<Received> receive(milliseconds wait) override {
    std::this_thread::sleep_for(wait);
    if (told_) return {};
    told_ = true;
    return {{1, true, {}}};
  }

 private:
  bool told_ = false;
};

// A communicator of two ranks whose all-reduce blocks until released;
// abort_job records that it was called (and what the guard printed is on
// stderr) instead of ending the process.
class Stuck final : public ThreadedCommunicator {
 public:
  explicit Stuck(std::shared_ptr<const Watchdog> watchdog)
      : ThreadedCommunicator(0, 300, std::make_shared<CommTally>(), std::move(watchdog)) {
    start_guard();
  }
  ~Stuck() override {
    release.set_value();
    drain();
  }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "stuck"; }
  CommWork all_reduce_async(void*, std::size_t count, DType type, ReduceOp) override {
    return submit({Collective::all_reduce, "all_reduce", count, type}, [this] {
      released.wait();
      return std::uint64_t{0};
    });
  }
  CommWork reduce_scatter_async(const void*, void*, std::size_t, DType, ReduceOp) override {
    return {};
  }
  CommWork all_gather_async(const void*, void*, std::size_t, DType) override { return {}; }
  CommWork reduce_scatter_v_async(const void*, void*, const std::vector<std::size_t>&, DType,
                                  ReduceOp) override {
    return {};
  }
  CommWork all_gather_v_async(const void*, void*, const std::vector<std::size_t>&, DType) override {
    return {};
  }
  CommWork broadcast_async(void*, std::size_t, DType, int) override { return {}; }
  CommWork barrier_async() override { return {}; }
  std::unique_ptr<Communicator> split(int, int) override { return nullptr; }

  std::atomic<int> aborts{0};
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();

 private:
  void abort_job() override { ++aborts; }
};

std::shared_ptr<const Watchdog> watchdog() {
  return std::make_shared<const Watchdog>(0, 2, std::make_unique<ClosedPeer>(), milliseconds(20),
                                          milliseconds(100));
}

}  // namespace

TEST_CASE("a collective a dead peer keeps from finishing ends the job within seconds") {
  Stuck comm(watchdog());
  float x = 1;
  CommWork work = comm.all_reduce_async(&x, 1, DType::f32, ReduceOp::sum);
  const auto start = std::chrono::steady_clock::now();
  while (comm.aborts == 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(10))
    std::this_thread::sleep_for(milliseconds(20));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(comm.aborts > 0);
  CHECK(took >= 0.9);  // a second's grace: the collective may still complete
  CHECK(took < 5.0);   // seconds, not [comm] timeout's 300, on however busy a machine
}

TEST_CASE("an idle communicator beside a peer that has left is not aborted") {
  Stuck comm(watchdog());
  std::this_thread::sleep_for(milliseconds(1500));
  CHECK(comm.aborts == 0);
}
