#include "comm/start_faults.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "ztrain/error.h"

namespace ztrain {
namespace {

constexpr const char* kPhases[] = {"store", "beats", "met", "published", "mpi_init", "connected"};

bool known(const std::string& phase) {
  for (const char* p : kPhases)
    if (phase == p) return true;
  return false;
}

}  // namespace

void start_fault_point(const char* phase, int rank) {
  const char* text = std::getenv("ZTRAIN_TEST_KILL_AT_START");
  if (!text || !*text) return;
  const std::string hook = text;
  const std::size_t colon = hook.find(':');
  const std::string at = hook.substr(0, colon);
  int at_rank = -1, used = 0;
  if (!known(at) || (colon != std::string::npos &&
                     (std::sscanf(hook.c_str() + colon + 1, "%d%n", &at_rank, &used) != 1 ||
                      at_rank < 0 || hook[colon + 1 + static_cast<std::size_t>(used)] != '\0')))
    throw ConfigError("ZTRAIN_TEST_KILL_AT_START=" + hook +
                      ": expected PHASE or PHASE:RANK, PHASE one of store, beats, met, "
                      "published, mpi_init, connected");
  if (at != phase || (at_rank >= 0 && at_rank != rank)) return;
  // Once published, the others read the address and start connecting to
  // this rank: give them the time to, so the death finds them in gloo's
  // connect, not in the store.
  if (at == "published") std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(::getpid(), SIGKILL);
}

}  // namespace ztrain
