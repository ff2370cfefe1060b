// The comparison as one self-contained HTML page (html_report.h): what was
// run, the verdict banner, the table of jobs, the difference of each
// strategy from the reference (so equivalence is seen, not only said),
// then memory (what decides between strategies), the curves and
// communication (run_charts.h).
#include <cstdio>
#include <string>
#include <vector>

#include "commands/compare_report.h"
#include "commands/html_report.h"
#include "commands/run_charts.h"
#include "ztrain/units.h"

namespace ztrain {
namespace {

using html::Best;
using html::Cell;
using html::Column;

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

Cell number(double v, int digits) {
  return {fixed(v, digits), v};
}

Cell mib(std::uint64_t bytes) {
  if (!bytes) return {"-", std::nullopt};
  const double v = static_cast<double>(bytes) / 1048576.0;
  return {fixed(v, 1), v};
}

const std::vector<Column>& columns() {
  static const std::vector<Column> c = {{"strategy", false, Best::none},
                                        {"outcome", false, Best::none},
                                        {"step, median (s)", true, Best::lowest},
                                        {"step, min - max (s)", true, Best::none},
                                        {"throughput (tokens/s)", true, Best::highest},
                                        {"compute (GFLOP/s)", true, Best::highest},
                                        {"sent per step (MiB)", true, Best::lowest},
                                        {"comm wait per step (ms)", true, Best::lowest},
                                        {"final train loss", true, Best::lowest},
                                        {"val loss", true, Best::lowest},
                                        {"skipped steps", true, Best::none},
                                        {"peak device (MiB)", true, Best::lowest},
                                        {"peak host (MiB)", true, Best::none},
                                        {"peak nvme (MiB)", true, Best::none}};
  return c;
}

html::Row job_row(const ComparedJob& j) {
  html::Row r;
  r.cells = {{j.strategy, std::nullopt}, {outcome_name(j.outcome), std::nullopt}};
  if (j.steps.empty()) {
    r.cells.resize(columns().size(), Cell{"-", std::nullopt});
  } else {
    const JobSummary f = summarize(j);
    r.cells.push_back(number(f.step_median, 4));
    r.cells.push_back({fixed(f.step_min, 4) + " - " + fixed(f.step_max, 4), std::nullopt});
    r.cells.push_back(number(f.tokens_per_s, 0));
    r.cells.push_back(number(f.flops_per_s / 1e9, 2));
    r.cells.push_back(number(f.bytes_per_step / 1048576.0, 2));
    r.cells.push_back(number(f.comm_wait_per_step * 1e3, 3));
    r.cells.push_back(number(j.steps.back().loss, 6));
    r.cells.push_back(j.val_loss ? number(*j.val_loss, 6) : Cell{"-", std::nullopt});
    r.cells.push_back({std::to_string(j.skipped_steps), std::nullopt});
    for (Tier t : kTiers) r.cells.push_back(mib(j.tier_peak[t]));
  }
  // Only completed jobs compete for the best marks.
  if (j.outcome != JobOutcome::completed)
    for (Cell& cell : r.cells) cell.value.reset();
  if (!j.error.empty()) r.error = j.strategy + ": " + j.error;
  return r;
}

// The banner: red when completed strategies differ (the verdict names the
// first step), amber when a job could not be compared (out of memory,
// failed, or only one completed), green when every job completed and
// agrees.
std::string verdict_banner(const Comparison& c) {
  std::string not_compared;
  std::size_t completed = 0;
  for (const ComparedJob& j : c.jobs) {
    if (j.outcome == JobOutcome::completed) {
      ++completed;
      continue;
    }
    not_compared +=
        (not_compared.empty() ? "" : ", ") + j.strategy + " (" + outcome_name(j.outcome) + ")";
  }
  if (!c.verdict.equivalent && !c.verdict.reference.empty())
    return html::banner(html::Level::red, "FAILED: " + c.verdict.message);
  if (!not_compared.empty() || completed < 2)
    return html::banner(html::Level::amber,
                        "Not everything could be compared: " + c.verdict.message +
                            (not_compared.empty() ? "" : "; not compared: " + not_compared));
  return html::banner(html::Level::green, c.verdict.message);
}

}  // namespace

std::string comparison_html(const Comparison& c) {
  std::string s = html::page_begin("ztrain compare: " + c.run_file, "ztrain compare");
  s += html::facts_block(c.facts);
  s += verdict_banner(c);
  std::vector<html::Row> rows;
  for (const ComparedJob& j : c.jobs) rows.push_back(job_row(j));
  s += html::table("jobs", columns(), rows);
  s += difference_figures(c.jobs, c.verdict.reference, c.tolerance);
  s += memory_figures(c.jobs, c.device_limit);
  s += curve_figures(c.jobs);
  s += comm_figures(c.jobs);
  return s + html::page_end();
}

}  // namespace ztrain
