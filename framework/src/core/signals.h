// One process-wide handler for SIGINT, SIGTERM and SIGHUP.
//
// Installed once (by whoever asks first) and never replaced, so nothing
// depends on the order in which parts install and restore handlers. On a
// signal it first unlinks every temporary file (TempFile); then, when some
// part watches that signal, it records it and returns (the watcher acts
// from its own thread: the watchdog prints which rank went silent, then
// calls die_by_signal); otherwise it ends the process as the default
// action would. Internal to libztrain.
//
// Thread safety: any thread; the handler is async-signal-safe.
#pragma once

namespace ztrain {

void install_signal_handler();
// While watched (count > 0), the signal is recorded instead of ending the
// process.
void watch_signal(int sig);
void unwatch_signal(int sig);
// The signal recorded since the last call (0: none), cleared.
int take_pending_signal();
// Ends the process by `sig`'s default action (temporary files removed).
[[noreturn]] void die_by_signal(int sig);

}  // namespace ztrain
