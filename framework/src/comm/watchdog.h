// Watchdog: which ranks of a job are alive, learnt from heartbeats, so that
// a job that stops because a rank died or froze says which one.
//
// Every rank runs one watchdog beside its world communicator (a thread
// waking every `period`). Rank 0 hears a heartbeat from every rank and
// sends one to each; its heartbeats carry the ranks it has not heard from
// for `silence` (with how long) or whose link closed, so every rank knows
// what rank 0 knows. A closed link is passed on at once, and rank 0's
// watchdog beats once more as it ends, so a rank that sees only rank 0 go
// still names the rank rank 0 lost.
// A backend supplies the Transport: the mpi backend sends MPI messages on a
// communicator of their own, the gloo backend a heartbeat connection to
// rank 0's rendezvous store that also shows a peer's death at once (the
// connection closes).
//
// A rank that fails (an error it has printed, out of memory) announces it:
// its next heartbeat, sent at once, carries its rank and message, rank 0
// passes the first failure it hears on to every rank, and each rank's
// communicators (comm_worker.h) then end the job with that message instead
// of waiting for collectives the failed rank will never join.
//
// verdict() is the sentence a collective timeout or failure prints. The
// watchdog also catches SIGTERM, which mpirun sends to the surviving ranks
// about a second after one died (and a scheduler sends before preemption):
// it waits up to `silence` for a rank to show as silent, prints the
// verdict, then lets SIGTERM end the process as it would have (through the
// process's one signal handler, core/signals.h).
//
// Thread safety: every public member from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ztrain {

// A rank rank 0 has not heard from, for how long (milliseconds), and
// whether its connection closed (it exited or died) rather than went quiet.
struct SilentRank {
  std::int32_t rank;
  std::int32_t silent_ms;
  std::int32_t closed;  // 0 or 1
};

// A rank that failed, and its error as it printed it (cut to
// kMaxFailureText bytes on the wire).
struct RankFailure {
  int rank = -1;
  std::string message;
};

// What one heartbeat carries: from rank 0, the ranks it has lost; from any
// rank, its own failure, or (rank 0) the first failure it heard of.
struct Heartbeat {
  std::vector<SilentRank> silent;
  std::optional<RankFailure> failure;
};

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  // How heartbeats travel. Called from the watchdog's thread only.
  class Transport {
   public:
    virtual ~Transport() = default;
    // One heartbeat to `peer` (at most kMaxSilent silent ranks); skipped
    // when the previous one to that peer has not left yet.
    virtual void beat(int peer, const Heartbeat& beat) = 0;
    struct Received {
      int from;
      bool closed;  // the connection to `from` closed: it exited or died
      Heartbeat beat;
    };
    // Heartbeats that arrived, waiting up to `wait` for the first.
    virtual std::vector<Received> receive(std::chrono::milliseconds wait) = 0;
  };
  static constexpr std::size_t kMaxSilent = 16;
  static constexpr std::size_t kMaxFailureText = 1024;

  Watchdog(int rank, int world, std::unique_ptr<Transport> transport,
           std::chrono::milliseconds period = std::chrono::milliseconds(100),
           std::chrono::milliseconds silence = std::chrono::milliseconds(500));
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // E.g. "rank 2 has sent no heartbeat for 3.1 s: it died or is frozen".
  std::string verdict() const;
  // The ranks known to have closed their connection, from this rank's own
  // links or rank 0's last report ("rank 2 closed its connection: it
  // exited or died"); empty while none has. A closed link is a death, a
  // silent one may be a slow rank: the ranks' start-up, which has no
  // timeout short enough for a frozen rank, ends on this.
  std::string closed_peers() const;
  // The verdict once a collective failed: a peer that exited breaks the
  // collective and closes its heartbeat link at about the same moment, so
  // this waits up to `silence` for the watchdog to hear which rank it was.
  std::string verdict_after_failure() const;

  // This rank failed with `message` (already printed): its heartbeats tell
  // the other ranks from now on. Waits up to a few periods for the first
  // one to leave. Only the first call counts.
  void announce_failure(const std::string& message);
  // The first failure of another rank heard of; nullopt while none.
  std::optional<RankFailure> peer_failure() const;
  // When this rank announced its own failure; nullopt while it has not.
  std::optional<Clock::time_point> failed_at() const;
  // True for the first caller only: the one that ends the job (the
  // communicators of a job share their watchdog, and each may find a
  // reason to end it at about the same moment).
  bool claim_ending() const;

 private:
  void loop();
  void beat(Clock::time_point now);
  void on_sigterm();
  // Records a heartbeat; true when it brings news rank 0 passes on at once.
  bool heard(const Transport::Received& r, Clock::time_point now);
  std::vector<SilentRank> silent_now(Clock::time_point now) const;
  std::string describe(const std::vector<SilentRank>& silent) const;
  // Under mu_: the ranks whose link closed, as describe() takes them.
  std::vector<SilentRank> closed_links() const;

  const int rank_, world_;
  const std::unique_ptr<Transport> transport_;
  const std::chrono::milliseconds period_, silence_;
  mutable std::mutex mu_;
  std::vector<Clock::time_point> last_;  // per rank: last heartbeat (rank 0: everyone's)
  std::vector<bool> closed_;
  std::vector<SilentRank> reported_;  // on ranks > 0: rank 0's last list
  Clock::time_point reported_at_;
  std::optional<RankFailure> own_failure_, peer_failure_;
  std::optional<Clock::time_point> failed_at_;
  bool tell_now_ = false;         // a failure to send before the next period
  std::condition_variable told_;  // tell_now_ went back to false
  mutable std::atomic<bool> ending_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ztrain
