#include "job/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "job/forwarded_signals.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// Slots per host past this are a typo, not a machine (and each slot is a
// list entry).
constexpr int kMaxSlots = 65536;

// A run of decimal digits as an int no larger than `max`; nullopt past it.
std::optional<int> small_number(const std::string& digits, int max) {
  int v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || end != digits.data() + digits.size() || v > max) return std::nullopt;
  return v;
}

// "h1:0,1@h2" -> {h1: {0,1}, h2: {}} (empty: every slot)
std::vector<std::pair<std::string, std::vector<int>>> parse_selection(const std::string& text,
                                                                      const char* flag) {
  std::vector<std::pair<std::string, std::vector<int>>> out;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, '@');) {
    part = trim(part);
    if (part.empty())
      throw ConfigError(std::string(flag) + " \"" + text + "\": empty host between '@'s");
    const auto colon = part.find(':');
    std::vector<int> slots;
    if (colon != std::string::npos) {
      std::stringstream slot_list(part.substr(colon + 1));
      for (std::string s; std::getline(slot_list, s, ',');) {
        if (!std::regex_match(s, std::regex("[0-9]+")))
          throw ConfigError(std::string(flag) + " \"" + text + "\": slot '" + s +
                            "' is not a slot index (write host:0,1@other)");
        const auto index = small_number(s, kMaxSlots - 1);
        if (!index)
          throw ConfigError(std::string(flag) + " \"" + text + "\": slot " + s +
                            " is past any host's slots");
        slots.push_back(*index);
      }
    }
    // A host named twice is one entry: its slots together, sorted, once
    // each (DeepSpeed's parse_node_config_list; a bare name adds none).
    const std::string name = part.substr(0, colon);
    auto same =
        std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == name; });
    if (same == out.end()) same = out.insert(out.end(), {name, {}});
    same->second.insert(same->second.end(), slots.begin(), slots.end());
  }
  for (auto& [name, slots] : out) {
    std::sort(slots.begin(), slots.end());
    slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
  }
  return out;
}

const HostSlots& find_host(const std::vector<HostSlots>& hosts, const std::string& name,
                           const char* flag) {
  for (const auto& h : hosts)
    if (h.host == name) return h;
  throw ConfigError(std::string(flag) + ": host '" + name + "' is not in the hostfile");
}

}  // namespace

std::vector<HostSlots> parse_hostfile_text(const std::string& text, const std::string& name) {
  static const std::regex line_re(R"(^\s*([A-Za-z0-9_.\-]+)\s+slots\s*=\s*([0-9]+)\s*$)");
  std::vector<HostSlots> hosts;
  std::stringstream ss(text);
  int lineno = 0;
  for (std::string line; std::getline(ss, line);) {
    ++lineno;
    const auto hash = line.find('#');
    if (hash != std::string::npos) line = line.substr(0, hash);
    if (trim(line).empty()) continue;
    std::smatch m;
    const std::string where = name + ":" + std::to_string(lineno) + ": ";
    if (!std::regex_match(line, m, line_re))
      throw ConfigError(where + "expected 'hostname slots=N', got '" + trim(line) + "'");
    const auto count = small_number(m[2].str(), kMaxSlots);
    if (!count)
      throw ConfigError(where + "host '" + m[1].str() + "' has slots=" + m[2].str() +
                        ", more than " + std::to_string(kMaxSlots) + "; give its number of GPUs");
    const int slots = *count;
    if (slots < 1)
      throw ConfigError(where + "host '" + m[1].str() + "' has slots=0; give it 1 or more");
    for (const auto& h : hosts)
      if (h.host == m[1].str())
        throw ConfigError(where + "host '" + h.host + "' is listed twice; list each host once");
    HostSlots h{m[1].str(), {}};
    for (int i = 0; i < slots; ++i) h.slots.push_back(i);
    hosts.push_back(std::move(h));
  }
  if (hosts.empty()) throw ConfigError(name + ": the hostfile lists no host");
  return hosts;
}

std::vector<HostSlots> parse_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot read hostfile '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hostfile_text(ss.str(), path);
}

std::vector<HostSlots> filter_hosts(std::vector<HostSlots> hosts, const std::string& include,
                                    const std::string& exclude) {
  if (!include.empty() && !exclude.empty())
    throw ConfigError("--include and --exclude cannot be used together (as in DeepSpeed)");
  auto check_slots = [](const HostSlots& h, const std::vector<int>& slots, const char* flag) {
    for (int s : slots)
      if (std::find(h.slots.begin(), h.slots.end(), s) == h.slots.end())
        throw ConfigError(std::string(flag) + ": host '" + h.host + "' has no slot " +
                          std::to_string(s) + " (it has " + std::to_string(h.slots.size()) + ")");
  };
  if (!include.empty()) {
    const auto chosen = parse_selection(include, "--include");
    for (const auto& [name, slots] : chosen)
      check_slots(find_host(hosts, name, "--include"), slots, "--include");
    // In the hostfile's order, as DeepSpeed maps ranks to hosts.
    std::vector<HostSlots> kept;
    for (const auto& h : hosts)
      for (const auto& [name, slots] : chosen)
        if (name == h.host) kept.push_back({name, slots.empty() ? h.slots : slots});
    return kept;
  }
  if (!exclude.empty()) {
    for (const auto& [name, slots] : parse_selection(exclude, "--exclude")) {
      const HostSlots& h = find_host(hosts, name, "--exclude");
      check_slots(h, slots, "--exclude");
      for (auto& host : hosts) {
        if (host.host != name) continue;
        if (slots.empty()) host.slots.clear();
        for (int s : slots)
          host.slots.erase(std::remove(host.slots.begin(), host.slots.end(), s), host.slots.end());
      }
    }
    hosts.erase(std::remove_if(hosts.begin(), hosts.end(),
                               [](const HostSlots& h) { return h.slots.empty(); }),
                hosts.end());
    if (hosts.empty()) throw ConfigError("--exclude leaves no host to run on");
  }
  return hosts;
}

std::string shell_line(const std::vector<std::string>& command) {
  std::string line;
  for (const auto& word : command) {
    const bool plain = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("-_./=:,@%+", c);
    });
    std::string quoted = "'";
    for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += (line.empty() ? "" : " ") + (plain ? word : quoted + "'");
  }
  return line;
}

std::vector<std::string> read_env_file(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  int lineno = 0;
  for (std::string line; std::getline(in, line);) {
    ++lineno;
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    if (line.find('=') == std::string::npos || line.front() == '=')
      throw ConfigError(path + ":" + std::to_string(lineno) + ": expected VAR=VALUE, got '" + line +
                        "'");
    out.push_back(line);
  }
  return out;
}

std::vector<HostSlots> limit_hosts(std::vector<HostSlots> hosts, int num_nodes, int num_gpus) {
  if (num_nodes >= 0) {
    if (num_nodes < 1 || num_nodes > static_cast<int>(hosts.size()))
      throw ConfigError("--num_nodes " + std::to_string(num_nodes) + ": the hostfile has " +
                        std::to_string(hosts.size()) + " host(s); give 1 to " +
                        std::to_string(hosts.size()));
    hosts.resize(static_cast<std::size_t>(num_nodes));
  }
  if (num_gpus >= 0)
    for (auto& h : hosts) {
      if (num_gpus < 1 || num_gpus > static_cast<int>(h.slots.size()))
        throw ConfigError("--num_gpus " + std::to_string(num_gpus) + ": host '" + h.host +
                          "' has " + std::to_string(h.slots.size()) + " slot(s); give 1 to " +
                          std::to_string(h.slots.size()));
      h.slots.resize(static_cast<std::size_t>(num_gpus));
    }
  return hosts;
}

namespace {

// The hosts' slots a job of `nproc` ranks takes (0: all), in order: the
// first host's first, as DeepSpeed's runner fills them.
std::vector<HostSlots> slots_taken(const LaunchPlan& plan) {
  std::string list;
  int total = 0;
  for (const auto& h : plan.hosts) {
    list += (list.empty() ? "" : ",") + h.host + ":" + std::to_string(h.slots.size());
    total += static_cast<int>(h.slots.size());
  }
  // More than the hosts have is an error, not the slots' count run silently.
  if (plan.nproc > total)
    throw ConfigError("--nproc " + std::to_string(plan.nproc) + " asks for more ranks than the " +
                      std::to_string(total) + " slots of the hosts (" + list +
                      "); lower --nproc or add slots to the hostfile");
  int left = plan.nproc > 0 ? plan.nproc : total;
  std::vector<HostSlots> taken;
  for (const auto& h : plan.hosts) {
    if (left == 0) break;
    const int n = std::min(left, static_cast<int>(h.slots.size()));
    taken.push_back({h.host, std::vector<int>(h.slots.begin(), h.slots.begin() + n)});
    left -= n;
  }
  return taken;
}

std::string joined(const std::vector<int>& slots) {
  std::string s;
  for (int i : slots) s += (s.empty() ? "" : ",") + std::to_string(i);
  return s;
}

}  // namespace

// With hosts, one application context per host (Open MPI's MPMD form,
// `A : B`), each with its own CUDA_VISIBLE_DEVICES: the host's slot ids, as
// DeepSpeed's launcher sets them, so local rank i runs on the i-th slot
// named (--include gpu004:1,3 uses GPUs 1 and 3, never 0 or 2). A slot
// choice through CUDA_VISIBLE_DEVICES in --env as well would contradict it.
std::vector<std::string> mpirun_command(const LaunchPlan& plan,
                                        const std::vector<std::string>& child_args) {
  std::vector<std::string> cmd{"mpirun"};
  if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");  // containers and CI run as root
  if (plan.hosts.empty() && plan.nproc > static_cast<int>(std::thread::hardware_concurrency()))
    cmd.push_back("--oversubscribe");
  // ztrain binds each rank to its share of the cores itself
  // (job/core_share.h); mpirun's default binding would pin a rank's threads
  // to one core.
  cmd.insert(cmd.end(), {"--bind-to", "none"});
  // mpirun runs in a process group of its own (run_mpirun), in the
  // background of a terminal: reading it for rank 0 would stop mpirun, and
  // no rank reads its input.
  cmd.insert(cmd.end(), {"--stdin", "none"});
  const auto context = [&](int np, const std::vector<std::string>& extra_env) {
    cmd.insert(cmd.end(), {"-np", std::to_string(np)});
    for (const auto& e : plan.env) cmd.insert(cmd.end(), {"-x", e});
    for (const auto& e : extra_env) cmd.insert(cmd.end(), {"-x", e});
    cmd.insert(cmd.end(), child_args.begin(), child_args.end());
  };
  if (plan.hosts.empty()) {
    context(plan.nproc, {});
    return cmd;
  }
  for (const auto& e : plan.env)
    if (e.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0)
      throw ConfigError("--env CUDA_VISIBLE_DEVICES (" + e +
                        ") and the hostfile's slots both choose the GPUs; choose them with "
                        "--include/--exclude host:slot,... and drop the variable");
  const std::vector<HostSlots> taken = slots_taken(plan);
  for (std::size_t i = 0; i < taken.size(); ++i) {
    if (i > 0) cmd.push_back(":");
    const auto& h = taken[i];
    cmd.insert(cmd.end(), {"--host", h.host + ":" + std::to_string(h.slots.size())});
    context(static_cast<int>(h.slots.size()), {"CUDA_VISIBLE_DEVICES=" + joined(h.slots)});
  }
  return cmd;
}

namespace {

// `name` as execvp would find it on PATH; empty when it is nowhere.
std::string on_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string file = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(file.c_str(), X_OK) == 0) return file;
  }
  return {};
}

// mpirun in a process group of its own (a terminal's Ctrl-C reaches the
// launcher alone), told to end (SIGTERM) if the launcher dies first, even
// by SIGKILL: the job never outlives the command that started it. The
// child calls only async-signal-safe functions (the launcher may have
// threads: OpenBLAS's).
pid_t start_mpirun(const std::vector<std::string>& command) {
  const std::string file = on_path(command[0]);
  if (file.empty())
    throw Error("cannot start '" + command[0] +
                "': not found on PATH; install Open MPI (openmpi-bin) to run several ranks");
  std::vector<char*> argv;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("cannot start mpirun: fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(128 + SIGTERM);  // the launcher is gone already
    ::execv(file.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

// Whether every process mpirun started has ended and waits to be reaped
// (a zombie), from /proc: false while one runs, or while it started none.
bool children_all_ended(pid_t mpirun) {
  std::vector<std::string> children;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(mpirun) + "/task", ec)) {
    std::ifstream in(task.path() / "children");
    for (std::string child; in >> child;) children.push_back(child);
  }
  for (const auto& child : children) {
    std::ifstream stat("/proc/" + child + "/stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');
    if (close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z')
      return false;
  }
  return !children.empty();
}

}  // namespace

// Open MPI's parameter for the directory its session directory goes in.
constexpr const char* kMpiSessionBase = "OMPI_MCA_orte_tmpdir_base";

OwnMpiSession::OwnMpiSession() {
  if (std::getenv(kMpiSessionBase)) return;
  std::error_code ec;
  const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  std::string pattern = ((ec ? std::filesystem::path("/tmp") : tmp) / "ztrain-mpi.XXXXXX").string();
  if (!::mkdtemp(pattern.data()))
    throw Error("cannot make a directory for Open MPI's session files (" + pattern +
                "): " + std::strerror(errno) + "; set TMPDIR to a writable directory");
  dir_ = pattern;
  ::setenv(kMpiSessionBase, dir_.c_str(), 1);
}

OwnMpiSession::~OwnMpiSession() {
  if (dir_.empty()) return;
  ::unsetenv(kMpiSessionBase);
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);  // what mpirun left, if it left anything
}

// mpirun can hang after its ranks have all ended on MPI_Abort (Open MPI
// 4.1: both ranks zombies, mpirun asleep, seen once in CI): when every
// child of it has ended for 3 s and it has not, it is ended here.
int run_mpirun(const std::vector<std::string>& command) {
  using Clock = std::chrono::steady_clock;
  const ForwardedSignals forwarded;
  const pid_t pid = start_mpirun(command);
  bool asked = false;
  std::optional<Clock::time_point> ended_since;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return exit_code_of(status);
    if (r < 0 && errno != EINTR) throw Error(std::string("waitpid: ") + std::strerror(errno));
    if (!children_all_ended(pid)) {
      ended_since.reset();
    } else if (!ended_since) {
      ended_since = Clock::now();
    } else if (Clock::now() - *ended_since > std::chrono::seconds(3)) {
      std::fprintf(stderr,
                   "ztrain: every rank has ended but mpirun has not after 3 s; ending it\n");
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return 1;
    }
    if (const int sig = ForwardedSignals::take()) {
      std::fprintf(stderr,
                   asked ? "ztrain: %s again: ending the job now\n"
                         : "ztrain: %s: every rank stops after its step, with a checkpoint (the "
                           "same signal again ends the job now)\n",
                   sig == SIGINT   ? "SIGINT"
                   : sig == SIGHUP ? "SIGHUP"
                                   : "SIGTERM");
      ::kill(pid, asked ? SIGTERM : SIGUSR1);
      asked = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace ztrain
