// One process-wide handler for SIGINT, SIGTERM, SIGHUP and SIGUSR1.
//
// While training asks for it (StopRequests), the first SIGINT, SIGTERM or
// SIGUSR1 (the launcher's stop, job/launcher.h) is a request to stop:
// recorded, nothing removed, so the run can finish its step and write a
// checkpoint; a second one ends the process at once.
// Where a part watches SIGTERM (the watchdog: mpirun sends SIGTERM when a
// rank died), that part judges first and calls request_stop when no rank
// is silent.
//
// Installed once (by whoever asks first) and never replaced, so nothing
// depends on the order in which parts install and restore handlers. On a
// signal it first unlinks every temporary file (TempFile); then, when some
// part watches that signal, it records it and returns (the watcher acts
// from its own thread: the watchdog prints which rank went silent, then
// calls die_by_signal); otherwise it ends the process as the default
// action would. In libztrain, exported to the host (ZTRAIN_KIT).
//
// Thread safety: any thread; the handler is async-signal-safe.
#pragma once

#include "kit/kit_export.h"

namespace ztrain {

ZTRAIN_KIT void install_signal_handler();
// While watched (count > 0), the signal is recorded instead of ending the
// process.
ZTRAIN_KIT void watch_signal(int sig);
ZTRAIN_KIT void unwatch_signal(int sig);
// The signal recorded since the last call (0: none), cleared.
ZTRAIN_KIT int take_pending_signal();
// Ends the process by `sig`'s default action (temporary files removed).
[[noreturn]] ZTRAIN_KIT void die_by_signal(int sig);

// While one lives, stop requests are taken as above.
class ZTRAIN_KIT StopRequests {
 public:
  StopRequests();
  ~StopRequests();
  StopRequests(const StopRequests&) = delete;
  StopRequests& operator=(const StopRequests&) = delete;
  // The signal that asked to stop (0: none yet).
  static int requested();
};
// Whether a StopRequests lives (the watchdog asks before judging SIGTERM).
ZTRAIN_KIT bool stop_requests_taken();
// Records a stop request by `sig` (a second one while recorded ends the
// process).
ZTRAIN_KIT void request_stop(int sig);
// The ranks agreed to stop (one of them was asked): from now until the
// process ends, its own first SIGINT/SIGTERM is taken as part of that stop
// (recorded; the watchdog does not judge it), a second ends it at once. A
// scheduler signals every rank, but not at the same moment.
ZTRAIN_KIT void stop_agreed();
// Whether stop_agreed was called (a SIGTERM the watchdog holds to judge is
// then part of the stop, whatever it finds).
ZTRAIN_KIT bool stop_is_agreed();

}  // namespace ztrain
