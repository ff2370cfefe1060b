#include "checkpoint/resume.h"

#include <chrono>
#include <map>
#include <optional>
#include <sstream>

#include <toml++/toml.h>

#include "checkpoint/reader.h"
#include "checkpoint/state_relay.h"
#include "checkpoint/tensor_parts.h"
#include "checkpoint/weights.h"
#include "config/run_settings.h"
#include "core/host_name.h"
#include "job/rank_agreement.h"

#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain {
namespace {

bool may_change(const std::string& key) {
  static const char* const kTrain[] = {"train.steps",
                                       "train.log_every",
                                       "train.print_every",
                                       "train.eval_every",
                                       "train.eval_batches",
                                       "train.tensorboard",
                                       "train.tensorboard_dir",
                                       "train.sample_every",
                                       "train.sample_prompt",
                                       "train.sample_tokens",
                                       "train.sample_temperature",
                                       "train.sample_top_k",
                                       "train.out_dir",
                                       "train.save_final",
                                       "train.export_to",
                                       "train.export_dtype",
                                       "train.resume",
                                       "train.checkpoint_every",
                                       "train.keep_last",
                                       "train.micro_batch_size",
                                       "train.grad_accum",
                                       "train.global_batch_size",
                                       "model.init_from",
                                       "train.checkpoint_write"};
  for (const char* k : kTrain)
    if (key == k) return true;
  for (const char* section : {"strategy.", "device.", "comm.", "parallel."})
    if (key.rfind(section, 0) == 0) return true;
  return false;
}

std::string shown(const std::string& v) {
  return v.empty() ? "unset" : v;
}

// "key = value" as TOML writes it.
std::string assignment(const std::string& key, const toml::node& value) {
  std::ostringstream text;
  text << toml::toml_formatter{toml::table{{"v", value}}};
  return key + text.str().substr(1);
}

// A number, or a duration or size as a run file may write it ("300s",
// "2GiB"), as the resolved file writes it: a number.
std::optional<double> as_number(const toml::node& n) {
  if (n.is_number()) return n.value<double>();
  if (!n.is_string()) return std::nullopt;
  const std::string text = n.value_or(std::string());
  for (const auto parse :
       {+[](const std::string& t) { return parse_duration(t); },
        +[](const std::string& t) { return static_cast<double>(parse_size(t)); }}) {
    try {
      return parse(text);
    } catch (const ConfigError&) {
    }
  }
  return std::nullopt;
}

// Equal as values: the run file's 1, "300s" and the resolved file's 1.0, 300.0.
bool same_value(const toml::node& a, const toml::node& b) {
  const auto x = as_number(a), y = as_number(b);
  if (x && y) return *x == *y;
  return assignment("v", a) == assignment("v", b);
}

// What a resumed run takes from the checkpoint's run: each key that run
// set (`theirs`, its config.toml, whose defaults are comments) which this
// run's command line does not set. This run's file yields too: it is the
// file the run was started from, or an older copy; where it says something
// else, the note says which value was kept. Not taken: train.resume, and
// grad_accum (it follows from the global batch, the micro-batch and the
// world size, which a resume may change).
class Inheritance {
 public:
  Inheritance(const RunConfig& config, std::string origin) : config_(config), origin_(origin) {}

  // The leaves of `theirs` under `prefix` to take, into `taken`.
  void take(const toml::table& theirs, const std::string& prefix, toml::table& taken) {
    for (const auto& [k, node] : theirs) {
      const std::string key = prefix + std::string(k.str());
      if (const auto* t = node.as_table()) {
        toml::table sub;
        take(*t, key + ".", sub);
        if (!sub.empty()) taken.insert(k.str(), std::move(sub));
        continue;
      }
      if (key == "train.resume" || key == "train.grad_accum" || from_command_line(key)) continue;
      const toml::node* mine = config_.table().at_path(key).node();
      if (mine && same_value(*mine, node)) continue;  // nothing to take
      if (mine)
        overruled_.push_back(config_.where(key) + " sets " + assignment(key, *mine) +
                             "; kept the run's " + assignment(key, node) + " (--set to change it)");
      else
        taken_.push_back(assignment(key, node));
      origins_[key] = origin_;
      taken.insert(k.str(), node);
    }
  }
  // Whether the section's plugin was chosen on this command line (another
  // strategy, say): then none of its keys are taken.
  bool replaced_on_command_line(const std::string& section, const std::string& theirs) const {
    return from_command_line(section + ".plugin") && config_.plugin(section, theirs) != theirs;
  }
  const std::map<std::string, std::string>& origins() const { return origins_; }
  std::string note() const {
    if (taken_.empty() && overruled_.empty()) return {};
    std::string text = "resume: continuing " + origin_ + ":";
    for (const auto& t : taken_) text += "\n  " + t;
    for (const auto& o : overruled_) text += "\n  " + o;
    return text;
  }

 private:
  // Set by --set, a --model or --strategy preset, or a DeepSpeed config:
  // anything but this run's file and the defaults.
  bool from_command_line(const std::string& key) const {
    const std::string where = config_.where(key);
    return where != "default" && !where.starts_with(config_.name() + ":");
  }

  const RunConfig& config_;
  const std::string origin_;
  std::vector<std::string> taken_, overruled_;
  std::map<std::string, std::string> origins_;
};

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
    checkpoint.check_model(whole_specs(r.model_params.empty() ? r.params : r.model_params));
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
  PartSource parts(source, r.params);
  strategy.load_state(parts);
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
  const auto load = [&](StateSource& s) {
    PartSource parts(s, r.params);
    strategy.load_state(parts);
  };
  out.bytes_moved = load_through_rank_0(load, source ? &*source : nullptr, false, "resume", comm);
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
    // `latest` read on each rank may have moved on between their reads
    // (a run still writing there): rank 0's choice holds for all.
    if (comm.size() > 1)
      out.dir = out.dir.parent_path() / rank_0_text(out.dir.filename().string(), comm);
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
  Inheritance inherit(config, "the run that wrote " + checkpoint->dir().string());
  for (const auto& [section, node] : theirs) {
    const auto* t = node.as_table();
    if (!t) continue;
    const std::string name(section.str());
    const std::string plugin = t->at_path("plugin").value_or(std::string());
    if (!plugin.empty() && inherit.replaced_on_command_line(name, plugin)) continue;
    toml::table taken;
    inherit.take(*t, name + ".", taken);
    // The run file's other plugin yields whole, so its options do not mix
    // with the checkpoint's plugin's.
    const bool other_plugin = !plugin.empty() && config.plugin(name, plugin) != plugin;
    if (!taken.empty() || other_plugin)
      config.set_imported(name, other_plugin ? *t : taken, other_plugin, inherit.origins());
  }
  if (const std::string note = inherit.note(); !note.empty()) config.add_note(note);
}

}  // namespace ztrain
