// What the process was doing when it crashed.
//
// A fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) inside a
// plugin's code would otherwise end the process with only the signal's
// name. While a CrashNote lives, the crash handler prints its text first
// ("ztrain: crashed (SIGSEGV) while starting plugin 'x' from /path/x.so"),
// removes the temporary files (swap files) as a signal would, and lets the
// signal end the process as it would have.
//
// Thread safety: notes are per process; the innermost live note is the one
// printed. The handler is async-signal-safe. Part of the host.
#pragma once

#include <string>

namespace ztrain {

class CrashNote {
 public:
  explicit CrashNote(const std::string& text);
  ~CrashNote();
  CrashNote(const CrashNote&) = delete;
  CrashNote& operator=(const CrashNote&) = delete;

 private:
  std::string previous_;
};

}  // namespace ztrain
