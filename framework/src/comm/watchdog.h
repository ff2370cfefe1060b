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
// verdict() is the sentence a collective timeout or failure prints. The
// watchdog also catches SIGTERM, which mpirun sends to the surviving ranks
// about a second after one died (and a scheduler sends before preemption):
// it waits up to `silence` for a rank to show as silent, prints the
// verdict, then lets SIGTERM end the process as it would have (through the
// process's one signal handler, core/signals.h).
//
// Thread safety: verdict() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
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

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  // How heartbeats travel. Called from the watchdog's thread only.
  class Transport {
   public:
    virtual ~Transport() = default;
    // One heartbeat to `peer`, carrying `silent` (at most kMaxSilent); skipped
    // when the previous one to that peer has not left yet.
    virtual void beat(int peer, const std::vector<SilentRank>& silent) = 0;
    struct Received {
      int from;
      bool closed;  // the connection to `from` closed: it exited or died
      std::vector<SilentRank> silent;
    };
    // Heartbeats that arrived, waiting up to `wait` for the first.
    virtual std::vector<Received> receive(std::chrono::milliseconds wait) = 0;
  };
  static constexpr std::size_t kMaxSilent = 16;

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

 private:
  void loop();
  void beat(Clock::time_point now);
  void on_sigterm();
  void heard(const Transport::Received& r, Clock::time_point now);
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
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ztrain
