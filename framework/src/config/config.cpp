#include "config/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain {
namespace fs = std::filesystem;

namespace {

std::string location(const toml::source_region& src, const std::string& file) {
  return file + ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column);
}

std::string join(const std::string& prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : prefix + "." + std::string(key);
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1u : 0u)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string suggestion(const std::string& key, const std::vector<std::string>& known) {
  // DeepSpeed's JSON spells the ZeRO-3 options with a stage3_ prefix.
  const std::string ds_prefix = "stage3_";
  if (key.starts_with(ds_prefix)) {
    const std::string bare = key.substr(ds_prefix.size());
    if (std::find(known.begin(), known.end(), bare) != known.end())
      return "; did you mean '" + bare + "'? (ztrain drops DeepSpeed's stage3_ prefix)";
  }
  std::string best;
  std::size_t best_d = 3;
  for (const auto& k : known) {
    const std::size_t d = edit_distance(key, k);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  return best.empty() ? "" : "; did you mean '" + best + "'?";
}

std::string node_text(const toml::node& n) {
  std::ostringstream os;
  os.precision(10);
  if (n.is_table()) {
    os << "a table";
  } else if (const auto* arr = n.as_array()) {
    os << "[";
    for (std::size_t i = 0; i < arr->size(); ++i) os << (i ? ", " : "") << node_text(*arr->get(i));
    os << "]";
  } else if (n.is_string()) {
    // A long value is cut: a message names it, it does not echo megabytes.
    const std::string v = n.value_or(std::string());
    constexpr std::size_t kShown = 120;
    std::size_t cut = std::min(v.size(), kShown);
    while (cut < v.size() && cut > 0 && (static_cast<unsigned char>(v[cut]) & 0xC0) == 0x80) --cut;
    os << '"' << v.substr(0, cut) << '"';
    if (cut < v.size()) os << "... (" << v.size() << " bytes)";
  } else if (n.is_floating_point()) {
    os << n.value_or(0.0);
  } else {
    n.visit([&](const auto& v) { os << v; });
  }
  return os.str();
}

}  // namespace

std::string toml_number_text(double d) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  // TOML floats need a fraction or an exponent: 3 is an integer.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::vector<std::string> comma_names(const std::string& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    std::string name = text.substr(at, comma - at);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    out.push_back(std::move(name));
    if (comma == text.size()) return out;
    at = comma + 1;
  }
}

std::string toml_value_text(const toml::node& n) {
  if (const auto* arr = n.as_array()) {
    std::string out = "[";
    for (std::size_t i = 0; i < arr->size(); ++i)
      out += (i ? ", " : "") + toml_value_text(*arr->get(i));
    return out + "]";
  }
  if (const auto* t = n.as_table()) {
    std::string out = "{";
    for (const auto& [k, v] : *t)
      out += (out.size() > 1 ? ", " : " ") + std::string(k.str()) + " = " + toml_value_text(v);
    return out + " }";
  }
  if (const auto* s = n.as_string()) {
    std::string out = "\"";
    for (char c : s->get()) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out + "\"";
  }
  if (const auto* d = n.as_floating_point()) return toml_number_text(d->get());
  std::ostringstream os;
  n.visit([&](const auto& v) { os << v; });
  return os.str();
}

namespace {

std::string section_label(const std::string& section) {
  return "[" + section + "]";
}

toml::table parse_text(const std::string& text, const std::string& name) {
  try {
    return toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    throw ConfigError(location(e.source(), name) + ": " + std::string(e.description()) +
                      " (this is not valid TOML; see https://toml.io for the syntax)");
  }
}

}  // namespace

RunConfig RunConfig::parse(const std::string& text, const std::string& name) {
  RunConfig c;
  c.name_ = name;
  c.root_ = parse_text(text, name);
  c.record_origins(c.root_, "", name);
  return c;
}

// Values travel as TOML with basic strings only (a multi-line literal
// string would lose a leading newline) and floats at full precision, so
// every value parses back equal.
std::string RunConfig::to_wire() const {
  std::ostringstream values;
  values << toml::toml_formatter{root_, toml::format_flags::none};
  nlohmann::json wire = {
      {"name", name_}, {"values", values.str()}, {"origins", origin_}, {"notes", notes_}};
  return wire.dump();
}

RunConfig RunConfig::from_wire(const std::string& text) {
  RunConfig c;
  try {
    const nlohmann::json wire = nlohmann::json::parse(text);
    c.name_ = wire.at("name").get<std::string>();
    c.root_ = toml::parse(wire.at("values").get<std::string>(), c.name_);
    c.origin_ = wire.at("origins").get<std::map<std::string, std::string>>();
    c.notes_ = wire.at("notes").get<std::vector<std::string>>();
  } catch (const std::exception& e) {
    throw ConfigError(std::string("the configuration sent by rank 0 does not parse (") + e.what() +
                      "); every rank must run the same ztrain build");
  }
  return c;
}

RunConfig RunConfig::load(const fs::path& run_file, const std::string& model,
                          const std::string& strategy, const std::vector<std::string>& overrides,
                          const std::vector<fs::path>& config_roots) {
  if (fs::is_directory(run_file))
    throw ConfigError("run file '" + run_file.string() +
                      "' is a directory; pass the path of a TOML run file (e.g. configs/run.toml)");
  std::ifstream in(run_file, std::ios::binary);
  if (!in)
    throw ConfigError("cannot read run file '" + run_file.string() +
                      "': " + (fs::exists(run_file) ? "permission denied" : "no such file") +
                      "; pass the path of a TOML run file (e.g. configs/run.toml)");
  std::stringstream ss;
  ss << in.rdbuf();
  RunConfig c = parse(ss.str(), run_file.string());
  // A file that sets nothing is more likely the wrong file than a wish for
  // every default (which configs/run.toml spells out).
  if (c.root_.empty())
    throw ConfigError("run file '" + run_file.string() +
                      "' sets nothing (it is empty or only comments); pass the run file you meant, "
                      "or start from configs/run.toml, which lists every key with its default");
  auto under = [&](const char* sub) {
    std::vector<fs::path> dirs;
    for (const auto& r : config_roots) dirs.push_back(r / sub);
    return dirs;
  };
  if (!model.empty()) c.refuse_dropped_method(model);
  if (!model.empty() && fs::is_directory(model)) {
    // A Hugging Face model directory (config/hf_model_import.h reads it).
    c.forget_origins("model");
    c.root_.insert_or_assign("model", toml::table{{"from", model}});
    c.origin_["model"] = c.origin_["model.from"] = "--model " + model;
  } else if (!model.empty() && !c.select_preset("model", model, under("models"))) {
    std::string looked;
    for (const auto& d : under("models")) looked += "\n  " + d.string();
    throw ConfigError("--model " + model + ": no model preset '" + model + ".toml' in:" + looked +
                      "\nname one of the files in configs/models, or set [model] keys with --set");
  }
  if (!strategy.empty()) c.select_strategy(strategy, under("strategies"));
  for (const auto& o : overrides) c.override_with(o);
  return c;
}

// --model replaces [model]: a fine-tuning method the run file sets there
// would go with it and the run train the whole model instead, unsaid.
void RunConfig::refuse_dropped_method(const std::string& model) const {
  const toml::table* t = root_["model"].as_table();
  if (!t) return;
  for (const auto& [key, node] : *t) {
    const std::string k(key.str());
    const bool method = k == "finetuning_type" || k == "adapter_from" || k == "use_rslora" ||
                        k.rfind("lora_", 0) == 0 || k.rfind("freeze_", 0) == 0;
    if (method && !(k == "finetuning_type" && node.value<std::string>() == "full"))
      throw ConfigError(where("model." + k) + ": [model] " + k + " would be dropped, as --model " +
                        model + " replaces [model]; give it with --set model." + k +
                        "=..., or name the model in the run file ([model] from = DIR, or the "
                        "preset's keys)");
  }
}

void RunConfig::record_origins(const toml::table& t, const std::string& prefix,
                               const std::string& file) {
  for (const auto& [key, node] : t) {
    const std::string path = join(prefix, key.str());
    origin_[path] = file.rfind("--set", 0) == 0 ? file : location(key.source(), file);
    if (const auto* sub = node.as_table()) record_origins(*sub, path, file);
  }
}

void RunConfig::forget_origins(const std::string& section) {
  for (auto it = origin_.begin(); it != origin_.end();)
    it = it->first == section || it->first.rfind(section + ".", 0) == 0 ? origin_.erase(it)
                                                                        : std::next(it);
}

std::optional<fs::path> RunConfig::select_preset(const std::string& section,
                                                 const std::string& name,
                                                 const std::vector<fs::path>& preset_dirs) {
  // A name ending in .toml is the preset file itself.
  const bool is_file = fs::path(name).extension() == ".toml";
  std::vector<fs::path> candidates;
  if (is_file)
    candidates.emplace_back(name);
  else
    for (const auto& dir : preset_dirs) candidates.push_back(dir / (name + ".toml"));
  for (const fs::path& preset : candidates) {
    std::error_code ec;
    if (!fs::is_regular_file(preset, ec)) continue;
    std::ifstream in(preset, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    toml::table t = parse_text(ss.str(), preset.string());
    for (const auto& [key, node] : t)
      if (key.str() != section)
        throw ConfigError(location(node.source(), preset.string()) + ": " + section + " preset '" +
                          name + "' sets [" + std::string(key.str()) +
                          "]; a preset may only hold a [" + section + "] table");
    if (!t.contains(section) || !t[section].is_table())
      throw ConfigError(preset.string() + ": " + section + " preset has no [" + section +
                        "] table");
    forget_origins(section);
    root_.insert_or_assign(section, *t[section].as_table());
    record_origins(t, "", preset.string());
    return preset;
  }
  if (is_file)
    throw ConfigError("--" + section + " " + name + ": no such " + section +
                      " preset file; give an existing .toml file or a preset name");
  return std::nullopt;
}

void RunConfig::select_strategy(const std::string& strategy,
                                const std::vector<fs::path>& preset_dirs) {
  if (select_preset("strategy", strategy, preset_dirs)) return;
  forget_origins("strategy");
  toml::table s;
  s.insert("plugin", strategy);
  root_.insert_or_assign("strategy", std::move(s));
  origin_["strategy"] = origin_["strategy.plugin"] = "--strategy " + strategy;
}

namespace {

// `from`'s keys into `into`, tables merged key by key.
void merge_table(toml::table& into, const toml::table& from) {
  for (const auto& [key, node] : from) {
    auto* sub = into.get_as<toml::table>(key);
    if (sub && node.is_table())
      merge_table(*sub, *node.as_table());
    else
      into.insert_or_assign(key, node);
  }
}

}  // namespace

void RunConfig::set_imported(const std::string& section, const toml::table& values, bool replace,
                             const std::map<std::string, std::string>& origins) {
  if (replace || !root_[section].is_table()) {
    forget_origins(section);
    root_.insert_or_assign(section, values);
  } else {
    merge_table(*root_[section].as_table(), values);
  }
  for (const auto& [key, origin] : origins)
    if (key.rfind(section + ".", 0) == 0) origin_[key] = origin;
}

void RunConfig::drop(const std::string& path) {
  const auto dot = path.rfind('.');
  if (dot == std::string::npos) return;
  if (auto* t = root_.at_path(path.substr(0, dot)).as_table()) t->erase(path.substr(dot + 1));
  origin_.erase(path);
}

void RunConfig::override_with(const std::string& assignment) {
  const std::string label = "--set " + assignment;
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(label + ": expected section.key=value (e.g. --set train.steps=20)");
  const std::string path = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ps(path);
  for (std::string part; std::getline(ps, part, '.');) {
    if (part.empty()) throw ConfigError(label + ": empty key in '" + path + "'");
    parts.push_back(part);
  }
  if (parts.size() < 2)
    throw ConfigError(label + ": '" + path +
                      "' names no section; write section.key=value (e.g. train.steps=20)");
  // A value that is valid TOML keeps its type (20, 3e-4, true, [0.9, 0.95]);
  // anything else is taken as a string, so paths and names need no quotes.
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value, label);
  } catch (const toml::parse_error&) {
    std::string quoted = "v = \"";
    for (char ch : value) {
      if (ch == '"' || ch == '\\') quoted += '\\';
      quoted += ch;
    }
    parsed = parse_text(quoted + "\"", label);
  }
  toml::table* t = &root_;
  std::string prefix;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    prefix = join(prefix, parts[i]);
    auto* n = t->get(parts[i]);
    if (!n) {
      t->insert(parts[i], toml::table{});
      origin_[prefix] = label;
      n = t->get(parts[i]);
    }
    if (!n->is_table())
      throw ConfigError(label + ": '" + prefix + "' is a value (set at " + where(prefix) +
                        "), not a table");
    t = n->as_table();
  }
  t->insert_or_assign(parts.back(), *parsed.get("v"));
  origin_[path] = label;
  if (const auto* sub = parsed.get("v")->as_table()) record_origins(*sub, path, label);
}

std::string RunConfig::where(const std::string& path) const {
  auto it = origin_.find(path);
  return it == origin_.end() ? "default" : it->second;
}

const std::vector<std::string>& run_file_sections() {
  static const std::vector<std::string> sections = {"model", "data",     "train",    "device",
                                                    "comm",  "parallel", "strategy", "schedule"};
  return sections;
}

void RunConfig::check_sections(const std::vector<std::string>& sections) const {
  for (const auto& [key, node] : root_) {
    const std::string k(key.str());
    if (std::find(sections.begin(), sections.end(), k) == sections.end()) {
      std::string list;
      for (const auto& s : sections) list += (list.empty() ? "" : ", ") + section_label(s);
      throw ConfigError(where(k) + ": unknown section or key '" + k + "'" +
                        suggestion(k, sections) + " (a run file has " + list + ")");
    }
    if (!node.is_table())
      throw ConfigError(where(k) + ": '" + k + "' must be a table ([" + k + "]), got " +
                        node_text(node));
  }
}

std::string RunConfig::plugin(const std::string& section, const std::string& fallback) const {
  const auto* n = root_.at_path(section + ".plugin").node();
  if (!n) return fallback;
  if (!n->is_string() || n->value_or(std::string()).empty())
    throw ConfigError(where(section + ".plugin") + ": [" + section +
                      "] plugin must be a non-empty string naming a plugin or a plugin file, "
                      "got " +
                      node_text(*n));
  return n->value_or(std::string());
}

namespace {

struct Validator {
  const RunConfig& cfg;
  const std::string& section;
  const OptionList& spec;
  const std::vector<std::string>& skip;
  Options out;

  std::vector<std::string> known_names() const {
    std::vector<std::string> names;
    for (const auto& s : spec.specs()) names.push_back(s.name);
    for (const auto& s : skip) names.push_back(s);
    return names;
  }

  [[noreturn]] void fail(const std::string& rel, const std::string& what) const {
    throw ConfigError(cfg.where(join(section, rel)) + ": " + section_label(section) + " " + rel +
                      ": " + what);
  }

  void walk(const toml::table& t, const std::string& prefix) {
    for (const auto& [key, node] : t) {
      const std::string rel = join(prefix, key.str());
      if (std::find(skip.begin(), skip.end(), rel) != skip.end()) continue;
      if (const auto* s = spec.find(rel)) {
        check(*s, rel, node);
        continue;
      }
      const bool is_prefix =
          std::any_of(spec.specs().begin(), spec.specs().end(),
                      [&](const OptionSpec& s) { return s.name.rfind(rel + ".", 0) == 0; });
      if (is_prefix && node.is_table()) {
        walk(*node.as_table(), rel);
        continue;
      }
      if (is_prefix) fail(rel, "must be a table of options, got " + node_text(node));
      const auto names = known_names();
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      fail(rel, "unknown key" + suggestion(rel, names) +
                    " (known keys: " + (list.empty() ? "none" : list) + ")");
    }
  }

  void check_range(const OptionSpec& s, const std::string& rel, double v,
                   const toml::node& node) const {
    if ((s.min && v < *s.min) || (s.max && v > *s.max))
      fail(rel, "got " + node_text(node) + ", expected " + s.expectation() +
                    (s.help.empty() ? "" : " (" + s.help + ")"));
  }

  void check(const OptionSpec& s, const std::string& rel, const toml::node& node) {
    auto wrong = [&]() {
      fail(rel, "got " + node_text(node) + ", expected " + s.expectation() +
                    (s.help.empty() ? "" : " (" + s.help + ")"));
    };
    // A word a number or integer option accepts instead of a number ("auto").
    auto keyword = [&]() {
      std::string word = node.value_or(std::string());
      if (std::find(s.choices.begin(), s.choices.end(), word) == s.choices.end()) wrong();
      return word;
    };
    OptionValue v;
    switch (s.type) {
      case OptionType::boolean:
        if (!node.is_boolean()) wrong();
        v = node.value_or(false);
        break;
      case OptionType::integer: {
        if (node.is_string()) {
          v = keyword();
          break;
        }
        double d = 0;
        if (node.is_integer())
          d = static_cast<double>(node.value_or<std::int64_t>(0));
        else if (node.is_floating_point())
          d = node.value_or(0.0);
        else
          wrong();
        // A TOML integer is an int64 already; a float must be a whole number
        // inside that range (2^63 is not).
        if (!node.is_integer() && (!std::isfinite(d) || d != std::floor(d))) wrong();
        if (!node.is_integer() && std::fabs(d) >= 9223372036854775808.0)
          fail(rel, "got " + node_text(node) +
                        ", past the 64-bit integers (at most 9223372036854775807)");
        check_range(s, rel, d, node);
        v = node.is_integer() ? node.value_or<std::int64_t>(0) : static_cast<std::int64_t>(d);
        break;
      }
      case OptionType::number: {
        if (node.is_string()) {
          v = keyword();
          break;
        }
        if (!node.is_number()) wrong();
        const double d = node.value_or(0.0);
        if (!std::isfinite(d)) wrong();
        check_range(s, rel, d, node);
        v = d;
        break;
      }
      case OptionType::string: {
        if (!node.is_string()) wrong();
        std::string str = node.value_or(std::string());
        if (!s.choices.empty() &&
            std::find(s.choices.begin(), s.choices.end(), str) == s.choices.end())
          fail(rel, "got " + node_text(node) + ", expected " + s.expectation() +
                        suggestion(str, s.choices));
        v = std::move(str);
        break;
      }
      case OptionType::size: {
        // wrong() and fail() add the key's place once: outside the try,
        // whose catch adds it to what the parsers say.
        if (!node.is_number() && !node.is_string()) wrong();
        if (node.is_integer() && node.value_or<std::int64_t>(0) < 0) wrong();
        std::uint64_t bytes = 0;
        try {
          if (node.is_integer())
            bytes = static_cast<std::uint64_t>(node.value_or<std::int64_t>(0));
          else if (node.is_floating_point())
            bytes = size_from_number(node.value_or(0.0));
          else
            bytes = parse_size(node.value_or(std::string()));
        } catch (const ConfigError& e) {
          fail(rel, e.what());
        }
        check_range(s, rel, static_cast<double>(bytes), node);
        v = static_cast<std::int64_t>(bytes);
        break;
      }
      case OptionType::duration: {
        if (!node.is_number() && !node.is_string()) wrong();
        double secs = 0;
        try {
          secs =
              node.is_number() ? node.value_or(0.0) : parse_duration(node.value_or(std::string()));
        } catch (const ConfigError& e) {
          fail(rel, e.what());
        }
        check_range(s, rel, secs, node);
        v = secs;
        break;
      }
      case OptionType::numbers: {
        const auto* arr = node.as_array();
        if (!arr) wrong();
        std::vector<double> list;
        for (const auto& e : *arr) {
          if (!e.is_number()) wrong();
          list.push_back(e.value_or(0.0));
          check_range(s, rel, list.back(), node);
        }
        v = std::move(list);
        break;
      }
      case OptionType::files:
      case OptionType::names: {
        std::vector<std::string> list;
        // A names string may list several, comma-separated.
        const auto add = [&](std::string text) {
          if (s.type == OptionType::files) return list.push_back(std::move(text));
          for (std::string& name : comma_names(text)) list.push_back(std::move(name));
        };
        if (node.is_string()) {
          add(node.value_or(std::string()));
        } else if (const auto* arr = node.as_array(); arr && !arr->empty()) {
          for (const auto& e : *arr) {
            if (!e.is_string()) wrong();
            add(e.value_or(std::string()));
          }
        } else {
          wrong();
        }
        for (const auto& name : list)
          if (name.empty())
            fail(rel, s.type == OptionType::files
                          ? "an empty file name; name a file or a glob pattern"
                          : "an empty name; " + s.help);
        v = std::move(list);
        break;
      }
    }
    out.set(rel, {std::move(v), cfg.where(join(section, rel)), true});
  }
};

}  // namespace

Options RunConfig::validate(const std::string& section, const OptionList& spec,
                            const std::vector<std::string>& skip) const {
  Validator val{*this, section, spec, skip, {}};
  const auto* node = root_.at_path(section).node();
  if (node) {
    if (!node->is_table())
      throw ConfigError(where(section) + ": '" + section + "' must be a table, got " +
                        node_text(*node));
    val.walk(*node->as_table(), "");
  }
  for (const auto& s : spec.specs()) {
    if (val.out.given(s.name)) continue;
    if (s.required)
      throw ConfigError(name_ + ": " + section_label(section) + " " + s.name +
                        " is required: " + s.help + " (expected " + s.expectation() + ")");
    val.out.set(s.name, {s.default_value, "default", false});
  }
  return std::move(val.out);
}

}  // namespace ztrain
