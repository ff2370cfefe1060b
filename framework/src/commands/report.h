// `ztrain report RUN_DIR [RUN_DIR...] [--out FILE.html]`: the page
// `ztrain compare` writes, for runs already trained. Each run directory
// (a run's train.out_dir) holds metrics.jsonl and config.toml, the
// resolved config; the runs are drawn overlaid, like compare's jobs, with
// their losses, learning rate, throughput and memory over steps, and each
// resolved config shown. There is no equivalence verdict: runs given here
// may differ on purpose (another seed, learning rate or model), so the
// banner only says what is shown, amber when a run logged fewer steps
// than its train.steps (stopped, failed or still running).
//
// Errors: ConfigError for no run directory or one that is not a
// directory; DataError for a missing or unreadable metrics.jsonl, or one
// without a training step.
// Thread safety: one call at a time.
#pragma once

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

namespace ztrain {

struct ReportArgs {
  std::vector<std::filesystem::path> run_dirs;
  std::filesystem::path out;  // empty: the first run's report.html
  std::string command_line;   // for the page's metadata
};

// Writes the page and says where; returns the exit status (0).
int report(const ReportArgs& args, std::ostream& os);

// The keys set in `section` of a resolved config.toml (what `ztrain
// config` prints: defaults are comments), as one line: "plugin =
// \"synthetic\", seed = 1234".
std::string config_section_summary(const std::filesystem::path& config_toml,
                                   const std::string& section);

}  // namespace ztrain
