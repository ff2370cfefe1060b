#include "job/forwarded_signals.h"

#include <signal.h>
#include <sys/wait.h>

#include <array>

namespace ztrain {
namespace {

volatile sig_atomic_t g_signal = 0;
void remember(int sig) {
  g_signal = sig;
}

constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGHUP};
std::array<struct sigaction, kSignals.size()> g_old{};

}  // namespace

ForwardedSignals::ForwardedSignals() {
  g_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = remember;
  sigemptyset(&sa.sa_mask);
  for (std::size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &sa, &g_old[i]);
}

ForwardedSignals::~ForwardedSignals() {
  for (std::size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &g_old[i], nullptr);
}

int ForwardedSignals::take() {
  const int sig = g_signal;
  g_signal = 0;
  return sig;
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace ztrain
