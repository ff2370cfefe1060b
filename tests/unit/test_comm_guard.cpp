// The communicators' guard: a collective that cannot finish because a peer
// died (the watchdog heard its link close) ends the job within about a
// second, naming the collective and the peer, instead of at [comm]
// timeout; an idle communicator beside a peer that has left (the end of a
// job) is left alone. A failure a rank announces travels in its
// heartbeats (rank 0 passes it on at once) and ends the other ranks a
// second later; the failed rank's own collective still running a second
// after its failure ends it too. Fake transports stand for the heartbeat
// links and a collective that never returns for one waiting on a peer
// that has gone.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "comm/beat_frame.h"
#include "comm/comm_worker.h"
#include "comm/watchdog.h"

using namespace ztrain;

namespace {

using std::chrono::milliseconds;

// Rank 1's heartbeat link to rank 0 closes at once.
class ClosedPeer final : public Watchdog::Transport {
 public:
  void beat(int, const Heartbeat&) override {}
  std::vector<Received> receive(milliseconds wait) override {
    std::this_thread::sleep_for(wait);
    if (told_) return {};
    told_ = true;
    return {{1, true, {}}};
  }

 private:
  bool told_ = false;
};

// Delivers `arrives` once, on the first receive, and records every
// heartbeat sent (peer, failure carried).
class Scripted final : public Watchdog::Transport {
 public:
  struct Sent {
    int peer;
    std::optional<RankFailure> failure;
  };
  struct Log {
    std::mutex mu;
    std::vector<Sent> sent;
    std::vector<Sent> snapshot() {
      std::lock_guard lock(mu);
      return sent;
    }
  };
  Scripted(std::vector<Received> arrives, std::shared_ptr<Log> log)
      : arrives_(std::move(arrives)), log_(std::move(log)) {}
  void beat(int peer, const Heartbeat& beat) override {
    std::lock_guard lock(log_->mu);
    log_->sent.push_back({peer, beat.failure});
  }
  std::vector<Received> receive(milliseconds wait) override {
    std::this_thread::sleep_for(std::min(wait, milliseconds(20)));
    return std::exchange(arrives_, {});
  }

 private:
  std::vector<Received> arrives_;
  std::shared_ptr<Scripted::Log> log_;
};

// What rank 1's heartbeat says when it failed.
Watchdog::Transport::Received failed_peer(int rank, const std::string& message) {
  return {rank, false, {{}, RankFailure{rank, message}}};
}

// A communicator of two ranks whose all-reduce blocks until released;
// abort_job records that it was called (and what the guard printed is on
// stderr) instead of ending the process.
class Stuck final : public ThreadedCommunicator {
 public:
  explicit Stuck(std::shared_ptr<Watchdog> watchdog)
      : ThreadedCommunicator(0, 300, std::make_shared<CommTally>(), std::move(watchdog)) {
    start_guard();
  }
  ~Stuck() override {
    if (release_on_destroy) release.set_value();
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
  CommWork all_to_all_async(const void*, void*, std::size_t, DType) override { return {}; }
  CommWork permute_async(const void*, void*, std::size_t, DType, Peers) override { return {}; }
  std::unique_ptr<Communicator> split(int, int) override { return nullptr; }

  std::atomic<int> aborts{0}, code{0};
  bool release_on_destroy = true;  // false: the collective stays stuck through drain()
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();

 private:
  void abort_job(int status) override {
    code = status;
    ++aborts;
  }
};

std::shared_ptr<Watchdog> watchdog() {
  return std::make_shared<Watchdog>(0, 2, std::make_unique<ClosedPeer>(), milliseconds(20),
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

namespace {

// Seconds until `comm` aborted (up to 10), and whether it did.
double seconds_to_abort(Stuck& comm) {
  const auto start = std::chrono::steady_clock::now();
  while (comm.aborts == 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(10))
    std::this_thread::sleep_for(milliseconds(20));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::shared_ptr<Watchdog> scripted(int rank, int world,
                                   std::vector<Watchdog::Transport::Received> arrives,
                                   std::shared_ptr<Scripted::Log> log = nullptr,
                                   milliseconds period = milliseconds(20)) {
  if (!log) log = std::make_shared<Scripted::Log>();
  return std::make_shared<Watchdog>(
      rank, world, std::make_unique<Scripted>(std::move(arrives), log), period, milliseconds(100));
}

}  // namespace

TEST_CASE("a peer's announced failure ends this rank about a second later, naming it") {
  auto dog = scripted(0, 2, {failed_peer(1, "out of memory on tier 'device'")});
  Stuck comm(dog);
  const double took = seconds_to_abort(comm);
  CHECK(comm.aborts == 1);
  CHECK(comm.code == 1);
  CHECK(took >= 0.9);  // a peer that fails the same way ends with its own error
  CHECK(took < 5.0);
  REQUIRE(dog->peer_failure());
  CHECK(dog->peer_failure()->rank == 1);
  CHECK(dog->verdict().find("rank 1 failed: out of memory on tier 'device'") == 0);
}

TEST_CASE("a rank that failed ends the job when its collective still runs two seconds later") {
  Stuck comm(scripted(0, 2, {}));
  float x = 1;
  CommWork work = comm.all_reduce_async(&x, 1, DType::f32, ReduceOp::sum);
  comm.announce_failure("out of memory");
  const double took = seconds_to_abort(comm);
  CHECK(comm.aborts == 1);
  CHECK(comm.code == 1);
  CHECK(took >= 1.9);  // after its peers' grace: they name it first
  CHECK(took < 5.0);
}

TEST_CASE("a rank that failed with nothing in flight, beside a peer that failed too, ends itself") {
  // Both ranks refused the same setting: each unwinds and exits with its
  // own error; neither is ended by the other's.
  Stuck comm(scripted(0, 2, {failed_peer(1, "config error")}));
  comm.announce_failure("config error");
  std::this_thread::sleep_for(milliseconds(1500));
  CHECK(comm.aborts == 0);
}

TEST_CASE("a failure is told at once: rank 1 to rank 0, rank 0 to every other rank") {
  // A period of a minute: only the failure itself makes a heartbeat leave.
  const milliseconds minute(60000);
  auto log1 = std::make_shared<Scripted::Log>();
  auto rank1 = scripted(1, 3, {}, log1, minute);
  rank1->announce_failure("out of memory");
  const auto from1 = log1->snapshot();
  REQUIRE_FALSE(from1.empty());  // sent before announce_failure returned
  CHECK(from1.back().peer == 0);
  REQUIRE(from1.back().failure);
  CHECK(from1.back().failure->rank == 1);
  CHECK(from1.back().failure->message == "out of memory");

  auto log0 = std::make_shared<Scripted::Log>();
  auto rank0 = scripted(0, 3, {failed_peer(1, "out of memory")}, log0, minute);
  const auto start = std::chrono::steady_clock::now();
  const auto relayed = [&] {
    for (const auto& s : log0->snapshot())
      if (s.peer == 2 && s.failure && s.failure->rank == 1) return true;
    return false;
  };
  while (!relayed() && std::chrono::steady_clock::now() - start < std::chrono::seconds(10))
    std::this_thread::sleep_for(milliseconds(10));
  CHECK(relayed());
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK_FALSE(rank0->failed_at());
}

TEST_CASE("a heartbeat's frame carries the silent ranks and a failure, its message cut whole") {
  Heartbeat hb;
  hb.silent = {{2, 1500, 0}, {3, 0, 1}};
  hb.failure = RankFailure{3, "out of memory on tier 'device'"};
  const auto back = decode_beat(encode_beat(hb));
  REQUIRE(back);
  REQUIRE(back->silent.size() == 2);
  CHECK(back->silent[0].rank == 2);
  CHECK(back->silent[0].silent_ms == 1500);
  CHECK(back->silent[1].closed == 1);
  REQUIRE(back->failure);
  CHECK(back->failure->rank == 3);
  CHECK(back->failure->message == hb.failure->message);
  CHECK_FALSE(decode_beat(encode_beat({}))->failure);

  // A message longer than the frame holds: cut before a whole character
  // (here a 3-byte "→" that would straddle the end) and marked.
  std::string text(Watchdog::kMaxFailureText - 4, 'x');
  text += "\u2192 and more";
  hb.failure->message = text;
  const std::string cut = decode_beat(encode_beat(hb))->failure->message;
  CHECK(cut.size() <= Watchdog::kMaxFailureText);
  CHECK(cut == std::string(Watchdog::kMaxFailureText - 4, 'x') + "...");

  BeatFrame wrong = encode_beat(hb);
  wrong.magic = 0;
  CHECK_FALSE(decode_beat(wrong));
}

TEST_CASE("a failed rank's communicator destroyed mid-collective ends the job, not waits") {
  // The strategy unwound without waiting on its collective: the
  // communicator's own teardown must not wait for it forever either.
  auto comm = std::make_unique<Stuck>(scripted(0, 2, {}));
  comm->release_on_destroy = false;
  float x = 1;
  CommWork work = comm->all_reduce_async(&x, 1, DType::f32, ReduceOp::sum);
  comm->announce_failure("out of memory");
  Stuck* raw = comm.get();
  std::atomic<int> aborted{0};
  // abort_job returns here (it ends the process for real): once it has been
  // called, let the collective go so the destructor can finish.
  std::thread releaser([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (raw->aborts == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(milliseconds(10));
    aborted = raw->aborts.load();
    raw->release.set_value();
  });
  const auto start = std::chrono::steady_clock::now();
  comm.reset();
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  releaser.join();
  CHECK(aborted == 1);
  CHECK(took < 5.0);
}
