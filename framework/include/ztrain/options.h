// Plugin options: declared by the plugin, validated by the host.
//
// A plugin declares what it accepts in an OptionList (name, type, default,
// range or choices, help). The host checks the plugin's TOML table against
// that list before any plugin code runs beyond the declaration: unknown keys,
// wrong types and out-of-range values are ConfigErrors with file:line:col.
// The plugin then receives an Options object holding a value for every
// declared option (the user's or the default) and where it came from, so a
// plugin that finds a cross-option problem can point at the line.
//
// Names may be dotted ("offload_optimizer.device"): the part before the dot
// is a sub-table in TOML. A number or integer option given choices (one_of)
// also accepts those words as strings ("auto"); keyword() then returns the
// word.
// A files option takes a string or a list of strings (file names or glob
// patterns, expanded by expand_files in ztrain/file_list.h); a names
// option the same, of names the plugin looks up (datasets, modules).
//
// Thread safety: an OptionList is built once; Options is read-only after the
// host made it and may be read from any thread.
#pragma once

#include <climits>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ztrain/export.h"

namespace ztrain {

enum class OptionType : std::uint8_t {
  boolean,
  integer,
  number,
  string,
  size,
  duration,
  numbers,
  files,
  names
};

ZTRAIN_API const char* option_type_name(OptionType t);

// bool, integer, number (also size in bytes as integer, duration in seconds
// as number), string, list of numbers, list of strings (files: one string
// given is a list of one). monostate: no value (optional option left unset,
// or a required one before validation).
using OptionValue = std::variant<std::monostate, bool, std::int64_t, double, std::string,
                                 std::vector<double>, std::vector<std::string>>;

ZTRAIN_API std::string option_value_text(const OptionValue& v);

struct ZTRAIN_API OptionSpec {
  std::string name;
  OptionType type = OptionType::string;
  OptionValue default_value;
  std::string help;
  std::optional<double> min;
  std::optional<double> max;
  std::vector<std::string> choices;
  bool required = false;

  OptionSpec& at_least(double v) {
    min = v;
    return *this;
  }
  OptionSpec& at_most(double v) {
    max = v;
    return *this;
  }
  // The plugin keeps the value in an int: a value outside int's range is a
  // ConfigError naming the key, never a narrowed (wrapped) number.
  OptionSpec& as_int() {
    if (!max || *max > INT_MAX) max = INT_MAX;
    if (!min || *min < INT_MIN) min = INT_MIN;
    return *this;
  }
  OptionSpec& one_of(std::vector<std::string> v) {
    choices = std::move(v);
    return *this;
  }
  OptionSpec& must_be_given() {
    required = true;
    return *this;
  }
  // "integer >= 1", "one of \"gpt2\", \"llama\"", ...
  std::string expectation() const;
};

class ZTRAIN_API OptionList {
 public:
  OptionSpec& flag(std::string name, bool def, std::string help);
  OptionSpec& integer(std::string name, std::int64_t def, std::string help);
  OptionSpec& number(std::string name, double def, std::string help);
  OptionSpec& string(std::string name, std::string def, std::string help);
  // A string option with no default: absent unless the user gives it.
  OptionSpec& optional_string(std::string name, std::string help);
  OptionSpec& size(std::string name, std::uint64_t def, std::string help);
  OptionSpec& duration(std::string name, double seconds, std::string help);
  OptionSpec& numbers(std::string name, std::vector<double> def, std::string help);
  // File names or glob patterns, one string or a list; absent unless given.
  OptionSpec& files(std::string name, std::string help);
  // One name or a list of names, none empty; absent unless given. A
  // string may hold several, comma-separated ("q_proj, v_proj", as
  // LLaMA-Factory writes lists), which get_names hands out one by one.
  OptionSpec& names(std::string name, std::string help);

  // Adds a spec built elsewhere; InternalError if the name is taken.
  OptionSpec& add(OptionSpec spec);

  const std::deque<OptionSpec>& specs() const { return specs_; }
  const OptionSpec* find(const std::string& name) const;

 private:
  std::deque<OptionSpec> specs_;
};

class ZTRAIN_API Options {
 public:
  struct Entry {
    OptionValue value;
    std::string where;  // "run.toml:3:1", "--set model.n_layer=2" or "default"
    bool given = false;
  };

  bool get_bool(const std::string& name) const;
  std::int64_t get_int(const std::string& name) const;
  double get_number(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;
  const std::vector<double>& get_numbers(const std::string& name) const;
  const std::vector<std::string>& get_files(const std::string& name) const;
  const std::vector<std::string>& get_names(const std::string& name) const;
  std::uint64_t get_size(const std::string& name) const {
    return static_cast<std::uint64_t>(get_int(name));
  }
  double get_duration(const std::string& name) const { return get_number(name); }

  // The word a number or integer option was given instead of a number, if
  // any.
  std::optional<std::string> keyword(const std::string& name) const;
  bool has_value(const std::string& name) const;
  bool given(const std::string& name) const;
  // Where the value came from, for error messages.
  std::string where(const std::string& name) const;

  void set(const std::string& name, Entry e) { entries_[name] = std::move(e); }
  const std::map<std::string, Entry>& entries() const { return entries_; }

 private:
  const Entry& entry(const std::string& name) const;
  std::map<std::string, Entry> entries_;
};

}  // namespace ztrain
