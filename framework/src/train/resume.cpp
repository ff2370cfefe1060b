#include "train/resume.h"

#include <chrono>
#include <map>
#include <optional>
#include <sstream>

#include <toml++/toml.h>

#include "core/host_name.h"
#include "train/checkpoint_reader.h"
#include "train/rank_agreement.h"
#include "train/run_settings.h"
#include "train/state_relay.h"

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

// The leaves of `theirs` (the checkpoint's run) that `config` does not set
// and a resume takes,
// into `taken` (dotted keys within the section, as set_imported takes them)
// and `list` ("key = value").
void take_unset(const toml::table& theirs, const std::string& prefix, const RunConfig& config,
                toml::table& taken, std::vector<std::string>& list) {
  for (const auto& [k, node] : theirs) {
    const std::string key = prefix + std::string(k.str());
    if (const auto* t = node.as_table()) {
      toml::table sub;
      take_unset(*t, key + ".", config, sub, list);
      if (!sub.empty()) taken.insert(k.str(), std::move(sub));
      continue;
    }
    // grad_accum follows from the global batch, the micro-batch and the
    // world size, which a resume may change.
    if (key == "train.resume" || key == "train.grad_accum" || config.table().at_path(key).node())
      continue;
    taken.insert(k.str(), node);
    std::ostringstream value;
    value << toml::toml_formatter{toml::table{{"v", node}}};
    list.push_back(key + value.str().substr(1));
  }
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

namespace {

// A refusal, naming the option it refuses.
std::string refused(const ResumeRequest& r, const std::exception& e) {
  return std::string("[train] resume = \"") + r.resume + "\": " + e.what();
}

// The checks a rank that has the checkpoint makes before reading any state;
// its refusal, or "".
std::string refusal(const ResumeRequest& r, const Checkpoint& checkpoint, Resumed& out) {
  try {
    checkpoint.check_model(r.params);
    out.changes = check_resume(checkpoint.manifest(), r.keys, r.global_batch, out.dir.string());
    // A checkpoint at or past the end has nothing to continue.
    if (const std::int64_t at = checkpoint.manifest().position.step; at >= r.steps)
      throw ConfigError(out.dir.string() + " is at step " + std::to_string(at) +
                        ", which train.steps = " + std::to_string(r.steps) +
                        " does not pass; raise train.steps to train further");
  } catch (const Error& e) {
    return refused(r, e);
  }
  return "";
}

// Every rank reads its own ranges of the checkpoint.
void resume_everywhere(const ResumeRequest& r, Strategy& strategy, Communicator& comm,
                       Resumed& out) {
  std::optional<Checkpoint> checkpoint;
  std::string why;
  try {
    checkpoint.emplace(out.dir);
  } catch (const Error& e) {
    why = refused(r, e);
  }
  if (checkpoint) why = refusal(r, *checkpoint, out);
  stop_together(why, "another rank refused to resume (its message says why)", comm);
  // Hosts with copies of their own must have the same checkpoint.
  check_files_agree("checkpoint", {(out.dir / "manifest.json").string()}, comm);
  CheckpointSource source(*checkpoint);
  strategy.load_state(source);
  out.position = checkpoint->manifest().position;
  out.world = checkpoint->manifest().world;
  out.bytes_read = source.bytes_read();
  out.read_seconds = source.seconds();
}

// Some rank cannot see the checkpoint: rank 0 checks it, sends its manifest
// (the position every rank continues from) and each rank its ranges.
void resume_through_rank_0(const ResumeRequest& r, Strategy& strategy, Communicator& comm,
                           bool seen, Resumed& out) {
  std::optional<Checkpoint> checkpoint;
  std::string why;
  if (comm.rank() == 0) {
    try {
      if (!seen)
        throw DataError("no checkpoint there on rank 0 (host " + host_name() +
                        "), which reads it for the ranks that cannot");
      checkpoint.emplace(out.dir);
      why = refusal(r, *checkpoint, out);
    } catch (const Error& e) {
      why = refused(r, e);
    }
  }
  stop_together(why, "rank 0 refused to resume (its message says why)", comm);
  const std::string manifest =
      rank_0_text(checkpoint ? manifest_json(checkpoint->manifest()) : "", comm);
  const Manifest m = checkpoint ? checkpoint->manifest() : parse_manifest(manifest, out.dir);
  std::optional<CheckpointSource> source;
  if (checkpoint) source.emplace(*checkpoint);
  out.bytes_moved =
      load_through_rank_0(strategy, source ? &*source : nullptr, false, "resume", comm);
  out.from_rank_0 = true;
  out.position = m.position;
  out.world = m.world;
  if (source) {
    out.bytes_read = source->bytes_read();
    out.read_seconds = source->seconds();
  }
}

}  // namespace

Resumed resume_from(const ResumeRequest& r, Strategy& strategy, Communicator& comm) {
  const auto t0 = std::chrono::steady_clock::now();
  Resumed out;
  std::string not_found;
  try {
    out.dir =
        Checkpoint::locate(r.resume == "latest" ? r.out_dir : std::filesystem::path(r.resume));
  } catch (const Error& e) {
    not_found = refused(r, e);
  }
  const bool seen = not_found.empty();
  // Through rank 0 when some ranks see the checkpoint and others do not;
  // when none does, each says so.
  if (comm.size() > 1 && any_rank(!seen, comm) && any_rank(seen, comm)) {
    out.dir = rank_0_text(out.dir.string(), comm);
    resume_through_rank_0(r, strategy, comm, seen, out);
  } else {
    stop_together(not_found, "another rank refused to resume (its message says why)", comm);
    resume_everywhere(r, strategy, comm, out);
  }
  if (out.world != comm.size())
    out.changes.insert(out.changes.begin(), "ranks: " + std::to_string(out.world) + " -> " +
                                                std::to_string(comm.size()));
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

void inherit_resumed_run(RunConfig& config) {
  const toml::node* resume = config.table().at_path("train.resume").node();
  if (!resume || !resume->is_string() || resume->value_or(std::string()).empty()) return;
  const std::string target = resume->value_or(std::string());
  std::optional<Checkpoint> checkpoint;
  toml::table theirs;
  try {
    checkpoint.emplace(Checkpoint::locate(target == "latest" ? resolve_out_dir(config)
                                                             : std::filesystem::path(target)));
    theirs = toml::parse(checkpoint->manifest().config_toml);
  } catch (const std::exception&) {
    return;  // resume_from reports it, with the rest of its checks
  }
  const std::string origin = "the run that wrote " + checkpoint->dir().string();
  std::vector<std::string> list;
  for (const auto& [section, node] : theirs) {
    const auto* t = node.as_table();
    if (!t) continue;
    const std::string name(section.str());
    const std::string plugin = t->at_path("plugin").value_or(std::string());
    if (!plugin.empty() && config.plugin(name, plugin) != plugin) continue;
    toml::table taken;
    const std::size_t before = list.size();
    take_unset(*t, name + ".", config, taken, list);
    std::map<std::string, std::string> origins;
    for (std::size_t i = before; i < list.size(); ++i)
      origins[list[i].substr(0, list[i].find(' '))] = origin;
    if (!taken.empty()) config.set_imported(name, taken, false, origins);
  }
  if (list.empty()) return;
  std::string note = "resume: from " + origin + ", what this run does not set:";
  for (const auto& l : list) note += "\n  " + l;
  config.add_note(note);
}

}  // namespace ztrain
