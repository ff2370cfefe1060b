#include "shard/swap_files.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <optional>

#include "core/host_name.h"
#include "ztrain/units.h"

namespace ztrain::shard {
namespace {

constexpr const char* kPrefix = "ztrain-swap@";

struct Owner {
  std::string host;
  long long pid;
};

// Whose swap file `file` is, when it is one.
std::optional<Owner> owner_of(const std::string& file) {
  if (file.starts_with(kPrefix)) {
    const std::string rest = file.substr(std::string(kPrefix).size());
    const std::size_t at = rest.find('@');
    const std::size_t name_at = at == std::string::npos ? at : rest.find('@', at + 1);
    if (name_at == std::string::npos) return std::nullopt;
    char* end = nullptr;
    const long long pid = std::strtoll(rest.c_str() + at + 1, &end, 10);
    if (end != rest.c_str() + name_at || pid <= 0) return std::nullopt;
    return Owner{rest.substr(0, at), pid};
  }
  // ztrain-PID-rankR.KIND, as earlier versions named them.
  char* end = nullptr;
  const bool state = file.ends_with(".optimizer") || file.ends_with(".params");
  if (!file.starts_with("ztrain-") || !state) return std::nullopt;
  const long long pid = std::strtoll(file.c_str() + 7, &end, 10);
  if (pid <= 0 || *end != '-') return std::nullopt;
  return Owner{host_name(), pid};
}

bool running(long long pid) {
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
}

// "NAME (1.00 MiB, WHOSE)".
std::string described(const std::filesystem::directory_entry& e, const std::string& whose) {
  std::error_code ec;
  const auto bytes = e.file_size(ec);
  return e.path().filename().string() + " (" + (ec ? std::string("?") : format_bytes(bytes)) +
         ", " + whose + ")";
}

}  // namespace

std::string swap_file_name(const std::string& name) {
  return kPrefix + host_name() + "@" + std::to_string(::getpid()) + "@" + name;
}

SwapSweep sweep_swap_files(const std::filesystem::path& dir) {
  SwapSweep out;
  const std::string here = host_name();
  const auto add = [](std::string& list, const std::string& item) {
    list += (list.empty() ? "" : ", ") + item;
  };
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::optional<Owner> o = owner_of(e.path().filename().string());
    if (!o || o->pid == ::getpid()) continue;
    const std::string pid = "pid " + std::to_string(o->pid);
    if (o->host != here) {
      add(out.others, described(e, "host " + o->host + ", " + pid));
    } else if (running(o->pid)) {
      add(out.others, described(e, pid + " running"));
    } else {
      const std::string file = described(e, pid);  // while it is there to measure
      std::error_code gone;
      if (std::filesystem::remove(e.path(), gone)) add(out.removed, file);
    }
  }
  if (!out.removed.empty())
    out.removed = "nvme_path '" + dir.string() +
                  "': removed the swap files of runs that ended without removing them (killed, "
                  "or crashed): " +
                  out.removed;
  return out;
}

}  // namespace ztrain::shard
