#include "comm/watchdog.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "core/signals.h"

namespace ztrain {
namespace {

std::string seconds(std::int64_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms) / 1000.0);
  return buf;
}

}  // namespace

Watchdog::Watchdog(int rank, int world, std::unique_ptr<Transport> transport,
                   std::chrono::milliseconds period, std::chrono::milliseconds silence)
    : rank_(rank),
      world_(world),
      transport_(std::move(transport)),
      period_(period),
      silence_(silence),
      last_(static_cast<std::size_t>(world), Clock::now()),
      closed_(static_cast<std::size_t>(world), false),
      reported_at_(Clock::now()) {
  watch_signal(SIGTERM);
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  stop_ = true;
  thread_.join();
  // Rank 0's last heartbeat says whom it has lost: a rank that learns of
  // the failure only from rank 0's end then still names the rank that
  // failed first.
  if (rank_ == 0) beat(Clock::now());
  unwatch_signal(SIGTERM);
  // One that came after the thread's last look ends the process as it
  // would have without the watchdog, unless the ranks are already stopping
  // (a scheduler's signal that reached this rank after another's).
  if (const int sig = take_pending_signal()) {
    if (!stop_is_agreed()) die_by_signal(sig);
    request_stop(sig);
  }
}

void Watchdog::loop() {
  auto next_beat = Clock::now();
  while (!stop_) {
    bool tell = false;
    for (const auto& r : transport_->receive(period_)) tell = heard(r, Clock::now()) || tell;
    const auto now = Clock::now();
    {
      std::lock_guard lock(mu_);
      tell = tell || tell_now_;
    }
    // A closed link or a failure goes out at once, not a period later: the
    // rank that sent it may be gone by then.
    if (now >= next_beat || tell) {
      next_beat = now + period_;
      beat(now);
      std::lock_guard lock(mu_);
      tell_now_ = false;
      told_.notify_all();
    }
    if (take_pending_signal() == SIGTERM) on_sigterm();
  }
}

void Watchdog::beat(Clock::time_point now) {
  Heartbeat hb;
  {
    std::lock_guard lock(mu_);
    hb.failure = own_failure_ ? own_failure_ : peer_failure_;
  }
  if (rank_ != 0) {
    if (!closed_[0]) transport_->beat(0, hb);
    return;
  }
  hb.silent = silent_now(now);
  if (hb.silent.size() > kMaxSilent) hb.silent.resize(kMaxSilent);
  for (int r = 1; r < world_; ++r)
    if (!closed_[static_cast<std::size_t>(r)]) transport_->beat(r, hb);
}

void Watchdog::on_sigterm() {
  // The job is ending on a failure (this rank's, a peer's, or this rank's
  // communicators are ending it): the launcher's SIGTERM is that end, not a
  // request to stop after the step, which would wait in a collective the
  // failed rank never joins. What happened is printed already.
  if (failed_at() || peer_failure() || ending_.load()) die_by_signal(SIGTERM);
  // mpirun's SIGTERM can come sooner after a death than `silence`: give the
  // dead rank the time to show as silent before judging.
  const auto until = Clock::now() + silence_;
  while (Clock::now() < until && silent_now(Clock::now()).empty() && !stop_is_agreed()) {
    for (const auto& r : transport_->receive(period_)) heard(r, Clock::now());
    beat(Clock::now());
  }
  // Every rank alive: a scheduler asking the run to stop, which training
  // takes where it can (a checkpoint first). Once the ranks agreed to stop
  // (another rank heard its signal first), this one is part of that stop,
  // whoever is silent by now: ranks that finished stopping have left.
  if (stop_is_agreed() || (silent_now(Clock::now()).empty() && stop_requests_taken())) {
    request_stop(SIGTERM);
    return;
  }
  const std::string line = "[rank " + std::to_string(rank_) +
                           "] ztrain: stopped by SIGTERM (mpirun sends it when another rank "
                           "failed, a scheduler before preemption); " +
                           verdict() + "\n";
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  die_by_signal(SIGTERM);
}

bool Watchdog::heard(const Transport::Received& r, Clock::time_point now) {
  std::lock_guard lock(mu_);
  const auto i = static_cast<std::size_t>(r.from);
  if (r.closed) {
    closed_[i] = true;
    return rank_ == 0;
  }
  last_[i] = now;
  if (r.from == 0 && rank_ != 0) {
    reported_ = r.beat.silent;
    reported_at_ = now;
  }
  const auto& f = r.beat.failure;
  if (!f || f->rank == rank_ || peer_failure_) return false;
  peer_failure_ = f;
  return rank_ == 0;  // rank 0 passes it on
}

std::vector<SilentRank> Watchdog::silent_now(Clock::time_point now) const {
  std::lock_guard lock(mu_);
  std::vector<SilentRank> out;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_ || (rank_ != 0 && r != 0)) continue;  // only rank 0 hears everyone
    const auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(
        now - last_[static_cast<std::size_t>(r)]);
    const bool closed = closed_[static_cast<std::size_t>(r)];
    if (closed || quiet >= silence_)
      out.push_back({r, static_cast<std::int32_t>(quiet.count()), closed ? 1 : 0});
  }
  return out;
}

std::string Watchdog::describe(const std::vector<SilentRank>& silent) const {
  std::string s;
  for (const auto& q : silent) {
    if (!s.empty()) s += "; ";
    s += "rank " + std::to_string(q.rank) +
         (q.closed
              ? " closed its connection: it exited or died"
              : " has sent no heartbeat for " + seconds(q.silent_ms) + ": it died or is frozen");
  }
  return s;
}

std::string Watchdog::verdict() const {
  const auto now = Clock::now();
  const std::vector<SilentRank> silent = silent_now(now);
  std::lock_guard lock(mu_);
  std::vector<std::string> parts;
  if (peer_failure_)
    parts.push_back("rank " + std::to_string(peer_failure_->rank) +
                    " failed: " + peer_failure_->message);
  if (const auto closed = closed_links(); !closed.empty()) parts.push_back(describe(closed));
  std::vector<SilentRank> open_silent;
  for (const auto& q : silent)
    if (!closed_[static_cast<std::size_t>(q.rank)]) open_silent.push_back(q);
  if (!open_silent.empty()) parts.push_back(describe(open_silent));
  if (rank_ != 0 && !reported_.empty()) {
    const auto age =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - reported_at_).count();
    parts.push_back("rank 0 reported " + seconds(age) + " ago: " + describe(reported_));
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "; ") + p;
  if (!out.empty()) return out;
  const std::string alive =
      "so none died or froze: the ranks wait in different collectives (a bug), or one is slower "
      "than [comm] timeout allows";
  if (rank_ == 0)
    return "every rank sent a heartbeat within " + seconds(silence_.count()) + ", " + alive;
  return "rank 0 hears every rank's heartbeat, " + alive;
}

std::vector<SilentRank> Watchdog::closed_links() const {
  std::vector<SilentRank> closed;
  for (int r = 0; r < world_; ++r)
    if (closed_[static_cast<std::size_t>(r)]) closed.push_back({r, 0, 1});
  return closed;
}

std::string Watchdog::closed_peers() const {
  std::lock_guard lock(mu_);
  std::string out = describe(closed_links());
  std::vector<SilentRank> reported;
  for (const auto& q : reported_)
    if (q.closed) reported.push_back(q);
  if (!reported.empty())
    out += (out.empty() ? "rank 0 reports: " : "; rank 0 reports: ") + describe(reported);
  return out;
}

std::string Watchdog::verdict_after_failure() const {
  const auto until = Clock::now() + silence_;
  while (Clock::now() < until && silent_now(Clock::now()).empty()) {
    {
      std::lock_guard lock(mu_);
      if (!reported_.empty() || peer_failure_) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return verdict();
}

void Watchdog::announce_failure(const std::string& message) {
  std::unique_lock lock(mu_);
  if (own_failure_) return;
  own_failure_ = RankFailure{rank_, message};
  failed_at_ = Clock::now();
  tell_now_ = true;
  told_.wait_for(lock, 4 * period_, [&] { return !tell_now_; });
}

std::optional<RankFailure> Watchdog::peer_failure() const {
  std::lock_guard lock(mu_);
  return peer_failure_;
}

std::optional<Watchdog::Clock::time_point> Watchdog::failed_at() const {
  std::lock_guard lock(mu_);
  return failed_at_;
}

bool Watchdog::claim_ending() const {
  return !ending_.exchange(true);
}

}  // namespace ztrain
