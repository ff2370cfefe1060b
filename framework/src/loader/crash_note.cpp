// The note lives in a fixed buffer the handler reads with write(2) only;
// the handler is installed with the first note (SA_RESETHAND, so the
// re-raised signal takes its default action and a crash inside the
// handler cannot loop).
#include "loader/crash_note.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "core/temp_files.h"

namespace ztrain {
namespace {

constexpr int kFatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
char g_note[1024];
std::atomic<std::size_t> g_length{0};
std::mutex g_mu;

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    default:
      return "SIGABRT";
  }
}

void say(const char* s, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}

void on_fatal(int sig) {
  const std::size_t n = g_length.load();
  if (n > 0) {
    const char* name = signal_name(sig);
    say("ztrain: crashed (", 17);
    say(name, std::strlen(name));
    say(") while ", 8);
    say(g_note, n);
    say("\n", 1);
  }
  remove_temp_files();
  ::raise(sig);  // the default action now (SA_RESETHAND)
}

void install() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : kFatal) {
      struct sigaction sa {};
      sa.sa_handler = on_fatal;
      sa.sa_flags = SA_RESETHAND;
      sigemptyset(&sa.sa_mask);
      sigaction(sig, &sa, nullptr);
    }
  });
}

void set(const std::string& text) {
  const std::size_t n = std::min(text.size(), sizeof g_note);
  g_length.store(0);
  std::memcpy(g_note, text.data(), n);
  g_length.store(n);
}

}  // namespace

CrashNote::CrashNote(const std::string& text) {
  install();
  std::lock_guard lock(g_mu);
  previous_.assign(g_note, g_length.load());
  set(text);
}

CrashNote::~CrashNote() {
  std::lock_guard lock(g_mu);
  set(previous_);
}

}  // namespace ztrain
