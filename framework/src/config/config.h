// RunConfig: the run file after the strategy preset and --set overrides,
// with the origin of every value, and validation of each section against a
// declared option list.
//
// Origins read "run.toml:12:7" for file values and "--set train.steps=20"
// for overrides, so every ConfigError points at what the user wrote.
//
// Thread safety: immutable after load.
#pragma once

#include <toml++/toml.h>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ztrain/options.h"

namespace ztrain {

// A TOML value as a run file writes it: strings quoted, doubles in the
// shortest text that reads back to the same bits ("0.9", not
// 0.90000000000000002), arrays and inline tables of those.
std::string toml_value_text(const toml::node& n);
std::string toml_number_text(double d);

// The names of one names-option string: "a, b" is a and b (LLaMA-Factory's
// comma-separated lists), blanks around each trimmed; an empty piece is
// kept, for the caller to refuse.
std::vector<std::string> comma_names(const std::string& text);

// The sections a run file may hold: the host's and the plugins'.
const std::vector<std::string>& run_file_sections();

class RunConfig {
 public:
  // Parses run_file; a non-empty model replaces [model] with the preset
  // `<root>/models/<model>.toml` (an error when there is none), or, when it
  // names a directory, with { from = model } (a Hugging Face model
  // directory, config/hf_model_import.h); a non-empty
  // strategy replaces [strategy] with `<root>/strategies/<strategy>.toml`, or
  // with { plugin = strategy } when there is no such preset; roots are
  // searched in order. Then applies `section.key=value` overrides in order.
  static RunConfig load(const std::filesystem::path& run_file, const std::string& model,
                        const std::string& strategy, const std::vector<std::string>& overrides,
                        const std::vector<std::filesystem::path>& config_roots);
  // From TOML text (tests, embedded defaults); `name` labels origins.
  static RunConfig parse(const std::string& text, const std::string& name);

  // The whole configuration as one text (values, origins, notes, name),
  // for rank 0 to send to the ranks that did not read the run file;
  // from_wire(to_wire()) equals the original in every value and message.
  // from_wire raises ConfigError on a text to_wire did not write.
  std::string to_wire() const;
  static RunConfig from_wire(const std::string& wire);

  // Applies one `section.key=value` override.
  void override_with(const std::string& assignment);
  // Replaces [section] with the one of `<dir>/<name>.toml` found first in
  // preset_dirs (a preset holds only that table); nullopt when none exists.
  std::optional<std::filesystem::path> select_preset(
      const std::string& section, const std::string& name,
      const std::vector<std::filesystem::path>& preset_dirs);
  // --strategy: the preset NAME if there is one, else { plugin = NAME }.
  void select_strategy(const std::string& strategy,
                       const std::vector<std::filesystem::path>& preset_dirs);

  // Values from another format (a DeepSpeed config): `values` replaces
  // [section] (replace) or is merged into it, key by key; `origins` names
  // where each came from ("train.lr" -> "ds.json: optimizer.params.lr").
  void set_imported(const std::string& section, const toml::table& values, bool replace,
                    const std::map<std::string, std::string>& origins);
  // Removes one value ("train.lr", "train.scheduler.warmup_type") and its
  // origin: what an import supersedes. Nothing when it is not there.
  void drop(const std::string& path);
  // Lines the run prints after its header (what an import resolved).
  void add_note(std::string note) { notes_.push_back(std::move(note)); }
  // ConfigError when --model would drop a fine-tuning key of [model].
  void refuse_dropped_method(const std::string& model) const;
  const std::vector<std::string>& notes() const { return notes_; }

  // Fails on top-level keys that are not one of `sections`
  // (run_file_sections(), for a run).
  void check_sections(const std::vector<std::string>& sections) const;
  // Validates [section] (dotted for nested) against spec; keys in `skip` are
  // left to another validator (e.g. "plugin").
  Options validate(const std::string& section, const OptionList& spec,
                   const std::vector<std::string>& skip = {}) const;
  // The `plugin` key of a section, or fallback when absent.
  std::string plugin(const std::string& section, const std::string& fallback) const;

  std::string where(const std::string& path) const;
  const toml::table& table() const { return root_; }
  const std::string& name() const { return name_; }

 private:
  void forget_origins(const std::string& section);
  void record_origins(const toml::table& t, const std::string& prefix, const std::string& file);
  toml::table root_;
  std::string name_;
  std::map<std::string, std::string> origin_;
  std::vector<std::string> notes_;
};

}  // namespace ztrain
