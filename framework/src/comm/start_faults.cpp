#include "comm/start_faults.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

namespace ztrain {
namespace {

StartKill& planned() {
  static StartKill kill;
  return kill;
}

}  // namespace

void plan_start_fault(const StartKill& kill) {
  planned() = kill;
}

void start_fault_point(const char* phase, int rank) {
  const StartKill& kill = planned();
  if (kill.phase != phase || (kill.rank >= 0 && kill.rank != rank)) return;
  // Once published, the others read the address and start connecting to
  // this rank: give them the time to, so the death finds them in gloo's
  // connect, not in the store.
  if (kill.phase == "published") std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(::getpid(), SIGKILL);
}

}  // namespace ztrain
