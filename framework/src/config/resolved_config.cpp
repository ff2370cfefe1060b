#include "config/resolved_config.h"

#include <sstream>

#include "config/run_settings.h"
#include "config/section_options.h"
#include "ztrain/pipeline/schedule.h"
#include "ztrain/version.h"

namespace ztrain {
namespace {

std::string string_text(const std::string& v) {
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The value as TOML; empty for an unset optional value.
std::string toml_text(const OptionValue& v) {
  if (std::holds_alternative<std::monostate>(v)) return {};
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (auto* i = std::get_if<std::int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) return toml_number_text(*d);
  if (auto* s = std::get_if<std::string>(&v)) return string_text(*s);
  if (auto* files = std::get_if<std::vector<std::string>>(&v)) {
    if (files->size() == 1) return string_text(files->front());
    std::string text = "[";
    for (const auto& f : *files) text += (text.size() > 1 ? ", " : "") + string_text(f);
    return text + "]";
  }
  std::string list = "[";
  for (double d : std::get<std::vector<double>>(v))
    list += (list.size() > 1 ? ", " : "") + toml_number_text(d);
  return list + "]";
}

// One section into both forms: its TOML lines and its keys as values.
void section(ResolvedConfig& out, std::ostringstream& os, const std::string& name,
             const std::string& plugin, const Options& options) {
  os << "\n[" << name << "]\n";
  if (!plugin.empty()) {
    os << "plugin = " << string_text(plugin) << "\n";
    out.keys.emplace_back(name + ".plugin", string_text(plugin));
  }
  for (const auto& [key, entry] : options.entries()) {
    // Defaults are listed as comments: read back, the file gives exactly
    // the keys the run was given (some defaults depend on which are, as
    // the batch sizes do).
    const std::string value = toml_text(entry.value);
    out.keys.emplace_back(name + "." + key, value);
    if (value.empty())
      os << "# " << key << " is unset\n";
    else if (!entry.given)
      os << "# " << key << " = " << value << "  (default)\n";
    else
      os << key << " = " << value << "  # " << entry.where << "\n";
  }
}

}  // namespace

ResolvedConfig resolve_config(const RunConfig& config, const PluginLoader& loader) {
  config.check_sections(run_file_sections());
  ResolvedConfig out;
  std::ostringstream os;
  os << "# ztrain " << ZTRAIN_VERSION
     << ": every key of this run, defaults included, each with where its value came from\n";
  const std::string model = config.plugin("model", "transformer");
  const std::string data = config.plugin("data", "synthetic");
  const std::string strategy = config.plugin("strategy", "ddp");
  section(out, os, "model", model,
          plugin_options(config, "model", loader.load("model", model), model_host_options()));
  section(out, os, "data", data,
          plugin_options(config, "data", loader.load("data", data), data_host_options()));
  section(out, os, "train", "", config.validate("train", train_options()));
  section(out, os, "device", "", config.validate("device", device_options()));
  section(out, os, "comm", "", config.validate("comm", comm_options()));
  const Options parallel = config.validate("parallel", parallel_options());
  section(out, os, "parallel", "", parallel);
  section(out, os, "strategy", strategy,
          plugin_options(config, "strategy", loader.load("strategy", strategy), OptionList{}));
  // A pipeline schedule's plugin options; none for a built-in schedule.
  const std::string schedule = parallel.get_string("pipeline_schedule");
  if (parallel.get_int("pipeline") > 1 && !pipeline::is_builtin_schedule(schedule))
    section(out, os, "schedule", schedule,
            plugin_options(config, "schedule", loader.load("schedule", schedule), OptionList{}));
  out.toml = os.str();
  return out;
}

}  // namespace ztrain
