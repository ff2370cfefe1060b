#include "job/run_outputs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "job/out_dir_names.h"
#include "job/rank_agreement.h"
#include "ztrain/units.h"

namespace ztrain {
namespace fs = std::filesystem;
namespace {

// The files a run leaves in its directory.
const std::vector<std::string> kRunFiles{
    "config.toml",    "metrics.jsonl",  "model.safetensors",     "config.json",
    "latest",         "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "tokenizer.model"};
// Room kept beyond the weights: metrics, the configuration, headers.
constexpr std::uint64_t kSlack = std::uint64_t{1} << 20;

// The nearest existing directory at or above `p` (where it would be made).
fs::path existing_ancestor(fs::path p) {
  p = fs::absolute(p);
  while (!p.empty() && !fs::is_directory(p)) {
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
  return p;
}

std::uint64_t free_bytes(const fs::path& dir) {
  struct statvfs vs {};
  if (::statvfs(dir.c_str(), &vs) != 0) return UINT64_MAX;  // unknown: do not refuse
  return static_cast<std::uint64_t>(vs.f_bavail) * vs.f_frsize;
}

// Why `dir` cannot take files; empty when it can. It is created (the run
// would create it anyway) and a probe file made and removed in it, which
// answers for read-only mounts, pseudo file systems and permissions alike.
std::string unwritable(const fs::path& dir, const std::string& key) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    return key + " '" + dir.string() + "' cannot be made a directory (" +
           (ec ? ec.message() : std::string("a file is in the way")) + "); choose another path";
  const fs::path probe = dir / (".ztrain-probe-" + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return key + " '" + dir.string() + "' cannot be written (" + std::strerror(errno) +
           "); choose a writable path";
  ::close(fd);
  fs::remove(probe, ec);
  return {};
}

// Whether a metrics file records a step trained or evaluated: without
// one, its run never got past its start.
bool logged_a_step(const fs::path& metrics) {
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j.value("split", "") != "") return true;
  }
  return false;
}

// The files of an earlier run in `dir`. A start that failed before its first
// step (out of memory, a configuration the strategy refused) leaves its
// config.toml and a metrics file without a step: that is no run, and the
// next start replaces them.
std::vector<std::string> earlier_run(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& f : kRunFiles)
    if (fs::exists(dir / f)) found.push_back(f);
  const bool trained = std::any_of(found.begin(), found.end(), [&](const std::string& f) {
    return f == "model.safetensors" || f == "config.json" || f == "latest" ||
           (f == "metrics.jsonl" && logged_a_step(dir / f));
  });
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (is_checkpoint_dir(e.path())) return found;
  return trained ? found : std::vector<std::string>{};
}

// The TensorBoard event files already in `dir`: another run's, which
// TensorBoard would draw as one run with this one's.
std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      found.push_back(e.path());
  return found;
}

// The reason rank 0 refuses these outputs (out_dir is made, writable and
// locked by now); empty when it does not.
std::string refusal(const RunOutputs& o) {
  const std::vector<std::string> earlier = earlier_run(o.out_dir);
  if (!earlier.empty() && !o.overwrite && !o.resuming) {
    std::string list;
    for (const auto& f : earlier) list += (list.empty() ? "" : ", ") + f;
    return "[train] out_dir '" + o.out_dir.string() + "' already holds a run (" + list +
           "); choose another out_dir, or pass --overwrite to replace that run";
  }
  if (!o.tensorboard_dir.empty() && !o.overwrite && !o.resuming)
    if (const auto files = event_files(o.tensorboard_dir); !files.empty())
      return "[train] tensorboard_dir '" + o.tensorboard_dir.string() + "' already holds " +
             std::to_string(files.size()) +
             " event file(s) of another run (TensorBoard would draw the two as one); choose "
             "another tensorboard_dir, or pass --overwrite to replace them";
  // Bytes each file system receives.
  struct Target {
    fs::path at;
    std::uint64_t bytes;
  };
  std::vector<Target> targets;
  if (o.save_final) targets.push_back({o.out_dir, 4 * static_cast<std::uint64_t>(o.n_params)});
  targets.push_back({o.out_dir, o.checkpoint_bytes});
  if (!o.export_to.empty()) {
    const bool file = o.export_to.extension() == ".safetensors";
    const fs::path dir = file ? o.export_to.parent_path() : o.export_to;
    if (auto why = unwritable(dir.empty() ? fs::path(".") : dir, "[train] export_to"); !why.empty())
      return why;
    const fs::path weights = file ? o.export_to : o.export_to / "model.safetensors";
    if (fs::exists(weights) && !o.overwrite)
      return "[train] export_to: '" + weights.string() +
             "' exists; choose another export_to, or pass --overwrite to replace it";
    targets.push_back({dir.empty() ? fs::path(".") : dir,
                       dtype_size(o.export_dtype) * static_cast<std::uint64_t>(o.n_params)});
  }
  targets.push_back({o.out_dir, 0});  // metrics and the configuration
  // Summed per file system (the device of the directory they land under).
  std::map<dev_t, std::pair<fs::path, std::uint64_t>> per_fs;
  for (const auto& t : targets) {
    const fs::path base = existing_ancestor(t.at);
    struct stat st {};
    if (::stat(base.c_str(), &st) != 0) continue;
    auto& [where, bytes] = per_fs.try_emplace(st.st_dev, base, kSlack).first->second;
    bytes += t.bytes;
  }
  for (const auto& [dev, need] : per_fs) {
    const std::uint64_t have = free_bytes(need.first);
    if (have < need.second)
      return "the run will write " + format_bytes(need.second) + " under '" + need.first.string() +
             "' (weights, checkpoints, metrics and configuration), but only " + format_bytes(have) +
             " are free there; free space, keep fewer checkpoints ([train] keep_last), or point "
             "[train] out_dir / export_to elsewhere";
  }
  return {};
}

// Removes the empty directories from `dir` up to (not including) `keep`:
// what the checks made for a run that was then refused.
// Never a file: out_dir or export_to may name an existing one.
void remove_made(fs::path dir, const fs::path& keep) {
  dir = fs::absolute(dir);
  std::error_code ec;
  while (!dir.empty() && dir != keep && dir != dir.parent_path() && fs::is_directory(dir, ec) &&
         fs::remove(dir, ec))
    dir = dir.parent_path();
}

}  // namespace

std::unique_ptr<OutDirLock> lock_out_dir(const fs::path& out_dir, Communicator& comm) {
  std::unique_ptr<OutDirLock> lock;
  std::string why, note;
  if (comm.rank() == 0) {
    try {
      lock = std::make_unique<OutDirLock>(out_dir, note);
    } catch (const ConfigError& e) {
      why = e.what();
    }
  }
  stop_together(why, "rank 0 cannot take the run's out_dir (its message says why)", comm);
  if (!note.empty()) std::printf("%s\n", note.c_str());
  return lock;
}

void check_run_outputs(const RunOutputs& outputs, std::unique_ptr<OutDirLock>& lock,
                       Communicator& comm) {
  const bool lead = comm.rank() == 0;
  const fs::path export_dir = outputs.export_to.extension() == ".safetensors"
                                  ? outputs.export_to.parent_path()
                                  : outputs.export_to;
  const fs::path export_base = export_dir.empty() ? fs::path() : existing_ancestor(export_dir);
  const std::string why = lead ? refusal(outputs) : std::string();
  if (!why.empty()) {
    lock.reset();  // and with it the out_dir it made
    if (!export_dir.empty()) remove_made(export_dir, export_base);
  }
  stop_together(why, "rank 0 refused the run's outputs (its message says why); nothing was trained",
                comm);
  if (lead && outputs.overwrite && !outputs.resuming) {
    std::error_code ec;
    for (const auto& f : kRunFiles) fs::remove(outputs.out_dir / f, ec);
    // The replaced run's checkpoints too: kept, they would mix with this
    // run's in `latest` and keep_last.
    for (const auto& e : fs::directory_iterator(outputs.out_dir, ec))
      if (is_checkpoint_dir(e.path())) fs::remove_all(e.path(), ec);
    if (!outputs.tensorboard_dir.empty())
      for (const auto& f : event_files(outputs.tensorboard_dir)) fs::remove(f, ec);
  }
}

}  // namespace ztrain
