#include "core/signals.h"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/temp_files.h"

namespace ztrain {
namespace {

// SIGUSR1 is how `ztrain --nproc` asks its ranks to stop: mpirun passes it
// on to every rank without ending the job itself (job/launcher.h).
constexpr std::array<int, 4> kSignals{SIGINT, SIGTERM, SIGHUP, SIGUSR1};
std::array<std::atomic<int>, kSignals.size()> g_watchers{};
std::atomic<int> g_pending{0};
std::atomic<int> g_stop_enabled{0};
std::atomic<int> g_stop{0};
std::atomic<int> g_agreed{0};
std::once_flag g_installed;

int index_of(int sig) {
  for (std::size_t i = 0; i < kSignals.size(); ++i)
    if (kSignals[i] == sig) return static_cast<int>(i);
  return -1;
}

// The second request, or a signal while the first is being judged, ends
// the process at once.
void end_now(int sig) {
  remove_temp_files();
  signal(sig, SIG_DFL);
  raise(sig);
}

void on_signal(int sig) {
  // The ranks already agreed to stop: this rank's first SIGINT/SIGTERM
  // (a scheduler's, delivered late) is part of that stop, whoever heard
  // it first; a second one still ends the process.
  if (g_agreed.load() != 0 && sig != SIGHUP) {
    if (g_stop.load() != 0) return end_now(sig);
    g_stop.store(sig);
    return;
  }
  const bool stoppable = sig != SIGHUP && g_stop_enabled.load() > 0;
  if (stoppable) {
    if (g_stop.load() != 0 || g_pending.load() != 0) return end_now(sig);
    const int w = index_of(sig);
    if (g_watchers[static_cast<std::size_t>(w)].load() > 0)
      g_pending.store(sig);
    else
      g_stop.store(sig);
    return;
  }
  remove_temp_files();
  const int i = index_of(sig);
  if (i >= 0 && g_watchers[static_cast<std::size_t>(i)].load() > 0) {
    g_pending.store(sig);
    return;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void install_signal_handler() {
  std::call_once(g_installed, [] {
    for (int sig : kSignals) {
      struct sigaction sa {};
      sa.sa_handler = on_signal;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;
      sigaction(sig, &sa, nullptr);
    }
  });
}

void watch_signal(int sig) {
  install_signal_handler();
  g_watchers[static_cast<std::size_t>(index_of(sig))].fetch_add(1);
}

void unwatch_signal(int sig) {
  g_watchers[static_cast<std::size_t>(index_of(sig))].fetch_sub(1);
}

int take_pending_signal() {
  return g_pending.exchange(0);
}

StopRequests::StopRequests() {
  install_signal_handler();
  g_stop_enabled.fetch_add(1);
}

StopRequests::~StopRequests() {
  g_stop_enabled.fetch_sub(1);
}

int StopRequests::requested() {
  return g_stop.load();
}

bool stop_requests_taken() {
  return g_stop_enabled.load() > 0;
}

void stop_agreed() {
  install_signal_handler();
  g_agreed.store(1);
}

bool stop_is_agreed() {
  return g_agreed.load() != 0;
}

void request_stop(int sig) {
  if (g_stop.exchange(sig) != 0) die_by_signal(sig);
}

void die_by_signal(int sig) {
  remove_temp_files();
  signal(sig, SIG_DFL);
  raise(sig);
  std::_Exit(128 + sig);
}

}  // namespace ztrain
