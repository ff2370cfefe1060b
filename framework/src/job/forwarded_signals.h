// What a launcher (`ztrain --nproc`, a machine's share of an Accelerate
// launch) does with the signals meant for the job it started: while a
// ForwardedSignals lives, SIGINT, SIGTERM and SIGHUP to this process are
// recorded instead of ending it, for the launcher to pass on to its
// children as it sees fit. Part of the host.
//
// Thread safety: construct and take() on the launcher's main thread; the
// handler itself is async-signal-safe.
#pragma once

namespace ztrain {

class ForwardedSignals {
 public:
  ForwardedSignals();
  ~ForwardedSignals();  // the handlers before it come back
  ForwardedSignals(const ForwardedSignals&) = delete;
  ForwardedSignals& operator=(const ForwardedSignals&) = delete;
  // The signal recorded since the last call (0: none), cleared.
  static int take();
};

// A child's wait status as a shell reports it: its exit code, or 128 + the
// signal that ended it.
int exit_code_of(int status);

}  // namespace ztrain
