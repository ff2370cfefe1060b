#include "train/resume.h"

#include <chrono>
#include <map>
#include <optional>

#include "train/checkpoint_reader.h"
#include "train/rank_agreement.h"

#include "ztrain/error.h"

namespace ztrain {
namespace {

bool may_change(const std::string& key) {
  static const char* const kTrain[] = {
      "train.steps",      "train.log_every",         "train.eval_every", "train.eval_batches",
      "train.out_dir",    "train.save_final",        "train.export_to",  "train.export_dtype",
      "train.resume",     "train.checkpoint_every",  "train.keep_last",  "train.micro_batch_size",
      "train.grad_accum", "train.global_batch_size", "model.init_from",  "train.checkpoint_write"};
  for (const char* k : kTrain)
    if (key == k) return true;
  for (const char* section : {"strategy.", "device.", "comm."})
    if (key.rfind(section, 0) == 0) return true;
  return false;
}

std::string shown(const std::string& v) {
  return v.empty() ? "unset" : v;
}

}  // namespace

std::vector<std::string> check_resume(const Manifest& checkpoint,
                                      const std::vector<std::pair<std::string, std::string>>& now,
                                      std::int64_t global_batch, const std::string& where) {
  const std::map<std::string, std::string> then(checkpoint.config.begin(), checkpoint.config.end());
  std::map<std::string, std::string> current(now.begin(), now.end());
  std::vector<std::string> changed;
  auto refuse = [&](const std::string& key, const std::string& a, const std::string& b) {
    throw ConfigError("cannot resume " + where + ": " + key + " is " + shown(a) +
                      " in the checkpoint and " + shown(b) +
                      " in this run; it changes what is trained. Set it back, or start a new "
                      "run (init_from takes the weights without the optimizer state)");
  };
  // Under another strategy its options are another plugin's: the plugin
  // says it all.
  const bool new_strategy = then.count("strategy.plugin") && current.count("strategy.plugin") &&
                            then.at("strategy.plugin") != current.at("strategy.plugin");
  auto said = [&](const std::string& key) {
    return key != "train.resume" &&
           !(new_strategy && key.rfind("strategy.", 0) == 0 && key != "strategy.plugin");
  };
  for (const auto& [key, value] : then) {
    const auto it = current.find(key);
    const std::string mine = it == current.end() ? "" : it->second;
    if (mine == value) continue;
    if (!may_change(key)) refuse(key, value, mine);
    if (said(key)) changed.push_back(key + ": " + shown(value) + " -> " + shown(mine));
  }
  for (const auto& [key, value] : current)
    if (!then.count(key) && !value.empty()) {
      if (!may_change(key)) refuse(key, "", value);
      if (said(key)) changed.push_back(key + ": unset -> " + value);
    }
  if (checkpoint.global_batch != global_batch)
    refuse("the global batch size (train.global_batch_size)",
           std::to_string(checkpoint.global_batch), std::to_string(global_batch));
  return changed;
}

Resumed resume_from(const ResumeRequest& r, Strategy& strategy, Communicator& comm) {
  const auto t0 = std::chrono::steady_clock::now();
  Resumed out;
  std::optional<Checkpoint> checkpoint;
  std::string why;
  try {
    out.dir =
        Checkpoint::locate(r.resume == "latest" ? r.out_dir : std::filesystem::path(r.resume));
    checkpoint.emplace(out.dir);
    checkpoint->check_model(r.params);
    out.changes = check_resume(checkpoint->manifest(), r.keys, r.global_batch, out.dir.string());
    // Before any state is read: a checkpoint at or past the end has
    // nothing to continue.
    if (const std::int64_t at = checkpoint->manifest().position.step; at >= r.steps)
      throw ConfigError(out.dir.string() + " is at step " + std::to_string(at) +
                        ", which train.steps = " + std::to_string(r.steps) +
                        " does not pass; raise train.steps to train further");
  } catch (const Error& e) {
    why = std::string("[train] resume = \"") + r.resume + "\": " + e.what();
  }
  stop_together(why, "another rank refused to resume (its message says why)", comm);
  CheckpointSource source(*checkpoint);
  strategy.load_state(source);
  out.position = checkpoint->manifest().position;
  if (checkpoint->manifest().world != comm.size())
    out.changes.insert(out.changes.begin(),
                       "ranks: " + std::to_string(checkpoint->manifest().world) + " -> " +
                           std::to_string(comm.size()));
  out.bytes_read = source.bytes_read();
  out.read_seconds = source.seconds();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace ztrain
