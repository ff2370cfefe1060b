#include "commands/report.h"

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "commands/compare_report.h"
#include "commands/html_report.h"
#include "commands/run_charts.h"
#include "commands/svg_chart.h"
#include "io/durable_file.h"
#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain {
namespace fs = std::filesystem;
namespace {

struct Run {
  fs::path dir;
  ComparedJob job;
  std::string config_text;  // empty: the run has no config.toml
  std::optional<std::int64_t> planned_steps;
  std::optional<std::uint64_t> memory_limit;
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The keys set (not commented out) in `section` of a resolved config, as
// (key, value) with the value's quotes and trailing comment dropped.
std::vector<std::pair<std::string, std::string>> section_keys(const std::string& text,
                                                              const std::string& section) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  std::string current;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind('[', 0) == 0) {
      current = line.substr(1, line.find(']') - 1);
      continue;
    }
    const std::size_t eq = line.find(" = ");
    if (current != section || line.empty() || line[0] == '#' || eq == std::string::npos) continue;
    std::string value = line.substr(eq + 3, line.find("  #") - eq - 3);
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"')
      value = value.substr(1, value.size() - 2);
    out.emplace_back(line.substr(0, eq), value);
  }
  return out;
}

std::string key_of(const std::string& text, const std::string& section, const std::string& key) {
  for (const auto& [k, v] : section_keys(text, section))
    if (k == key) return v;
  return {};
}

Run load_run(const fs::path& dir, const std::string& label) {
  if (!fs::is_directory(dir))
    throw ConfigError("report: '" + dir.string() +
                      "' is not a directory; give run directories (a run's train.out_dir, which "
                      "holds metrics.jsonl and config.toml)");
  const fs::path metrics = dir / "metrics.jsonl";
  if (!fs::exists(metrics))
    throw DataError("report: '" + metrics.string() + "' does not exist: '" + dir.string() +
                    "' is not a run directory, or its run has not logged a step yet (give the "
                    "run's train.out_dir)");
  Run r;
  r.dir = dir;
  r.job.strategy = label;
  if (read_job_metrics(metrics, r.job))
    std::fprintf(stderr,
                 "report: %s: its last line is cut short (the run stopped while writing it: a "
                 "full disk or a kill) and is left out\n",
                 metrics.string().c_str());
  if (r.job.steps.empty())
    throw DataError("report: '" + metrics.string() +
                    "' holds no training step; wait for the run's first logged step "
                    "(train.log_every) or give another run directory");
  if (fs::exists(dir / "config.toml")) {
    r.config_text = read_text(dir / "config.toml");
    const std::string steps = key_of(r.config_text, "train", "steps");
    if (!steps.empty()) r.planned_steps = std::stoll(steps);
    const std::string limit = key_of(r.config_text, "device", "memory_limit");
    if (!limit.empty() && limit != "0") r.memory_limit = parse_size(limit);
  }
  return r;
}

// Each run's label: its directory's name, with its parent's where two
// runs share a name.
std::vector<std::string> labels(const std::vector<fs::path>& dirs) {
  std::vector<std::string> out;
  for (const fs::path& d : dirs) {
    const fs::path p = d.lexically_normal();
    out.push_back((p.has_filename() ? p : p.parent_path()).filename().string());
  }
  for (std::size_t i = 0; i < out.size(); ++i)
    for (std::size_t k = 0; k < out.size(); ++k)
      if (i != k && out[i] == out[k]) out[i] = dirs[i].lexically_normal().string();
  return out;
}

std::string run_summary(const Run& r) {
  if (r.config_text.empty()) return r.dir.string() + " (no config.toml)";
  const std::string& t = r.config_text;
  return r.dir.string() + ": model " + key_of(t, "model", "plugin") + " " +
         key_of(t, "model", "arch") + "; data " +
         config_section_summary(r.dir / "config.toml", "data") + "; strategy " +
         key_of(t, "strategy", "plugin") + "; precision " + key_of(t, "train", "precision") +
         "; device " + key_of(t, "device", "kind");
}

std::string runs_banner(const std::vector<Run>& runs) {
  std::string short_runs;
  for (const Run& r : runs)
    if (r.planned_steps && r.job.steps.back().step < *r.planned_steps)
      short_runs += (short_runs.empty() ? "" : ", ") + r.job.strategy + " logged step " +
                    std::to_string(r.job.steps.back().step) + " of " +
                    std::to_string(*r.planned_steps);
  const std::string shown = std::to_string(runs.size()) + (runs.size() == 1 ? " run" : " runs") +
                            " shown; no equivalence verdict (runs given here may differ on "
                            "purpose; `ztrain compare` trains strategies alike and judges them)";
  if (!short_runs.empty())
    return html::banner(html::Level::amber,
                        shown + ". Not finished (stopped, failed or still running): " + short_runs);
  return html::banner(html::Level::neutral, shown + ".");
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

html::Cell number(double v, int digits) {
  return {fixed(v, digits), v};
}

std::string runs_table(const std::vector<Run>& runs) {
  using html::Best;
  const std::vector<html::Column> columns = {{"run", false, Best::none},
                                             {"steps logged", true, Best::none},
                                             {"step, median (s)", true, Best::lowest},
                                             {"throughput (tokens/s)", true, Best::highest},
                                             {"compute (GFLOP/s)", true, Best::highest},
                                             {"final train loss", true, Best::lowest},
                                             {"val loss", true, Best::lowest},
                                             {"final lr", true, Best::none},
                                             {"skipped steps", true, Best::none},
                                             {"peak device (MiB)", true, Best::lowest},
                                             {"peak host (MiB)", true, Best::none},
                                             {"peak nvme (MiB)", true, Best::none}};
  std::vector<html::Row> rows;
  for (const Run& r : runs) {
    const ComparedJob& j = r.job;
    const JobSummary f = summarize(j);
    html::Row row;
    char lr[32];
    std::snprintf(lr, sizeof lr, "%.3g", j.steps.back().lr);
    row.cells = {{j.strategy, std::nullopt},
                 {std::to_string(j.steps.size()) +
                      (r.planned_steps ? " of " + std::to_string(*r.planned_steps) : ""),
                  std::nullopt},
                 number(f.step_median, 4),
                 number(f.tokens_per_s, 0),
                 number(f.flops_per_s / 1e9, 2),
                 number(j.steps.back().loss, 6),
                 j.val_loss ? number(*j.val_loss, 6) : html::Cell{"-", std::nullopt},
                 {lr, std::nullopt},
                 {std::to_string(j.skipped_steps), std::nullopt}};
    for (Tier t : kTiers)
      row.cells.push_back(j.tier_peak[t]
                              ? number(static_cast<double>(j.tier_peak[t]) / 1048576.0, 1)
                              : html::Cell{"-", std::nullopt});
    rows.push_back(std::move(row));
  }
  return html::table("runs", columns, rows);
}

std::string report_page(const std::vector<Run>& runs, const std::string& command_line) {
  std::string names;
  for (const Run& r : runs) names += (names.empty() ? "" : ", ") + r.job.strategy;
  html::Facts facts = html::machine_facts(command_line);
  for (auto& [k, v] : facts)
    if (k == "host" || k == "CPU" || k == "date") k += " (this page)";
  for (std::size_t i = 0; i < runs.size(); ++i)
    facts.insert(facts.begin() + 1 + static_cast<std::ptrdiff_t>(i),
                 {"run " + runs[i].job.strategy, run_summary(runs[i])});
  std::string s = html::page_begin("ztrain report: " + names, "ztrain report");
  s += html::facts_block(facts) + runs_banner(runs) + runs_table(runs);
  std::vector<ComparedJob> jobs;
  for (const Run& r : runs) jobs.push_back(r.job);
  s += curve_figures(jobs) + memory_figures(jobs, runs.front().memory_limit) + comm_figures(jobs);
  for (const Run& r : runs)
    s += "<h2>Resolved config: " + chart::escape(r.job.strategy) + "</h2>\n<pre class=\"config\">" +
         chart::escape(r.config_text.empty() ? "(no config.toml in " + r.dir.string() + ")"
                                             : r.config_text) +
         "</pre>\n";
  return s + html::page_end();
}

}  // namespace

std::string config_section_summary(const fs::path& config_toml, const std::string& section) {
  std::string out;
  for (const auto& [k, v] : section_keys(read_text(config_toml), section))
    out += (out.empty() ? "" : ", ") + k + " = " + v;
  return out;
}

int report(const ReportArgs& a, std::ostream& os) {
  if (a.run_dirs.empty())
    throw ConfigError(
        "report: give one or more run directories: ztrain report RUN_DIR "
        "[RUN_DIR...] [--out FILE.html]");
  const std::vector<std::string> names = labels(a.run_dirs);
  std::vector<Run> runs;
  for (std::size_t i = 0; i < a.run_dirs.size(); ++i)
    runs.push_back(load_run(a.run_dirs[i], names[i]));
  const fs::path out = a.out.empty() ? a.run_dirs.front() / "report.html" : a.out;
  write_file_atomically(out, report_page(runs, a.command_line));
  os << "written: " << out.string() << "\n";
  return 0;
}

}  // namespace ztrain
