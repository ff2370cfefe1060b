#include "job/local_ranks.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include "job/forwarded_signals.h"
#include "ztrain/error.h"

extern char** environ;

namespace ztrain {
namespace {

// The ranks started so far: one process group, led by the first.
class RankGroup {
 public:
  void spawn(const std::vector<std::string>& command, const std::vector<std::string>& extra) {
    std::vector<std::string> env_text(extra);
    for (char** e = environ; *e; ++e) {
      const std::string entry(*e);
      const std::string name = entry.substr(0, entry.find('='));
      bool replaced = false;
      for (const std::string& x : extra) replaced |= x.compare(0, name.size() + 1, name + "=") == 0;
      if (!replaced) env_text.push_back(entry);
    }
    std::vector<char*> argv, envp;
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (const auto& e : env_text) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, group_);
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, argv[0], nullptr, &attr, argv.data(), envp.data());
    posix_spawnattr_destroy(&attr);
    if (rc != 0)
      throw Error("cannot start rank " + std::to_string(live_.size()) + " ('" + command[0] +
                  "'): " + std::strerror(rc));
    if (group_ == 0) group_ = pid;
    live_.push_back(pid);
  }
  void signal(int sig) const {
    if (group_ != 0) ::killpg(group_, sig);
  }
  // One rank that ended (its status), or none yet.
  std::optional<int> reap() {
    int status = 0;
    const pid_t pid = ::waitpid(-group_, &status, WNOHANG);
    if (pid <= 0) return std::nullopt;
    std::erase(live_, pid);
    return status;
  }
  bool empty() const { return live_.empty(); }
  ~RankGroup() {
    if (live_.empty()) return;
    signal(SIGKILL);
    while (!live_.empty() && reap_blocking()) {
    }
  }
  RankGroup() = default;
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

 private:
  bool reap_blocking() {
    int status = 0;
    const pid_t pid = ::waitpid(-group_, &status, 0);
    if (pid <= 0) return errno == EINTR;
    std::erase(live_, pid);
    return true;
  }
  pid_t group_ = 0;
  std::vector<pid_t> live_;
};

}  // namespace

std::vector<std::vector<std::string>> local_rank_env(const MachineShare& s) {
  std::vector<std::vector<std::string>> env;
  for (int local = 0; local < s.per_machine; ++local)
    env.push_back({"RANK=" + std::to_string(s.machine_rank * s.per_machine + local),
                   "WORLD_SIZE=" + std::to_string(s.machines * s.per_machine),
                   "LOCAL_RANK=" + std::to_string(local),
                   "LOCAL_WORLD_SIZE=" + std::to_string(s.per_machine),
                   "GROUP_RANK=" + std::to_string(s.machine_rank), "MASTER_ADDR=" + s.main_addr,
                   "MASTER_PORT=" + std::to_string(s.main_port)});
  return env;
}

// Polls rather than blocks in waitpid, so that a signal, a failed rank
// and the grace period's end are all seen within 50 ms.
int run_local_ranks(const std::vector<std::string>& command,
                    const std::vector<std::vector<std::string>>& env, std::chrono::seconds grace) {
  const ForwardedSignals forwarded;
  RankGroup group;
  for (const auto& extra : env) group.spawn(command, extra);
  int result = 0;
  using Clock = std::chrono::steady_clock;
  Clock::time_point kill_at = Clock::time_point::max();  // max: no kill planned
  while (!group.empty()) {
    if (const int sig = ForwardedSignals::take()) group.signal(sig);
    if (const auto status = group.reap()) {
      if (exit_code_of(*status) != 0 && result == 0) {
        result = exit_code_of(*status);
        group.signal(SIGTERM);
        kill_at = Clock::now() + grace;
      }
      continue;
    }
    if (Clock::now() >= kill_at) {
      group.signal(SIGKILL);
      kill_at = Clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return result;
}

}  // namespace ztrain
