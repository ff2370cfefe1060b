#include "commands/run_charts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>

#include "commands/html_report.h"
#include "commands/svg_chart.h"
#include "ztrain/units.h"

namespace ztrain {
namespace {

using chart::BarChart;
using chart::BarRow;
using chart::LineChart;
using chart::Point;
using chart::Segment;
using chart::Series;

constexpr const char* kJobColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                       "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};
constexpr const char* kCategoryColours[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                            "#59a14f", "#edc948", "#b07aa1"};
static_assert(std::size(kCategoryColours) == kCategoryCount);

std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// A binary unit for bytes up to `most`: its size and name.
std::pair<double, std::string> byte_unit(double most) {
  static const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double unit = 1;
  int k = 0;
  while (k < 4 && most >= unit * 1024) {
    unit *= 1024;
    ++k;
  }
  return {unit, names[k]};
}

// The legend of the jobs that logged steps, but `skip`.
std::string jobs_legend(const std::vector<ComparedJob>& jobs, const std::string& skip = {}) {
  std::vector<std::pair<std::string, std::string>> items;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    if (!jobs[i].steps.empty() && jobs[i].strategy != skip)
      items.emplace_back(jobs[i].strategy, job_colour(i));
  return html::legend(items);
}

// One series per job that logged steps, of `value` over its steps. Lines
// of equal values lie on top of each other, so the first is drawn widest
// and each later one narrower: every one stays visible.
double line_width(std::size_t i, std::size_t n) {
  const double step = std::min(1.0, 6.0 / std::max<double>(1, static_cast<double>(n)));
  return 1.5 + step * static_cast<double>(n - 1 - i);
}

std::vector<Series> job_series(const std::vector<ComparedJob>& jobs,
                               const std::function<double(const ComparedStep&)>& value) {
  std::vector<Series> out;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    Series s{jobs[i].strategy, job_colour(i), {}, line_width(i, jobs.size()), 0};
    for (const ComparedStep& st : jobs[i].steps)
      s.points.push_back({static_cast<double>(st.step), value(st)});
    if (!s.points.empty()) out.push_back(std::move(s));
  }
  return out;
}

std::string curve(const std::vector<ComparedJob>& jobs, const std::string& id,
                  const std::string& heading, const std::string& y_label,
                  const std::function<double(const ComparedStep&)>& value,
                  const std::string& caption = {}) {
  LineChart c{id, "step", y_label, job_series(jobs, value), {}, false, 0, {}};
  return html::figure(heading, chart::line_chart(c) + jobs_legend(jobs), caption);
}

std::string val_curve(const std::vector<ComparedJob>& jobs) {
  LineChart c{"val_loss", "step", "validation loss", {}, {}, false, 0, {}};
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    Series s{jobs[i].strategy, job_colour(i), {}, 2.5, 0};
    for (const auto& [step, loss] : jobs[i].val_curve)
      s.points.push_back({static_cast<double>(step), loss});
    if (!s.points.empty()) c.series.push_back(std::move(s));
  }
  return html::figure("Validation loss", chart::line_chart(c) + jobs_legend(jobs),
                      "Each point is one evaluation.");
}

// |a - b| relative to b (absolute where b is 0), as the verdict measures.
double relative(double a, double b) {
  return b == 0 ? std::fabs(a) : std::fabs(a - b) / std::fabs(b);
}

std::string difference_chart(const std::vector<ComparedJob>& jobs, const ComparedJob& ref,
                             bool loss, double tol) {
  std::map<std::int64_t, const ComparedStep*> by_step;
  for (const ComparedStep& s : ref.steps) by_step[s.step] = &s;
  LineChart c{loss ? "diff_loss" : "diff_grad_norm",
              "step",
              loss ? "relative loss difference" : "relative grad-norm difference",
              {},
              {{tol, "tolerance " + short_number(tol), "#c62828"}},
              true,
              0,
              "0 (exact)"};
  double smallest = tol;
  std::size_t exact = 0, total = 0;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (&jobs[i] == &ref || jobs[i].outcome != JobOutcome::completed) continue;
    Series s{jobs[i].strategy, job_colour(i), {}, line_width(i, jobs.size()), 0};
    for (const ComparedStep& st : jobs[i].steps) {
      const auto it = by_step.find(st.step);
      if (it == by_step.end()) continue;
      const double d = loss ? relative(st.loss, it->second->loss)
                            : relative(st.grad_norm, it->second->grad_norm);
      if (d > 0) smallest = std::min(smallest, d);
      exact += d == 0;
      ++total;
      s.points.push_back({static_cast<double>(st.step), d});
    }
    c.series.push_back(std::move(s));
  }
  // A decade below the smallest difference (or the tolerance): exact zeros
  // are drawn on it, apart from every measured difference.
  c.log_floor = std::pow(10.0, std::floor(std::log10(smallest)) - 1);
  return chart::line_chart(c) + "<p class=\"key\">" + std::to_string(exact) + " of " +
         std::to_string(total) + " points are exactly 0 (drawn on the bottom line, " +
         chart::escape(short_number(c.log_floor)) + ").</p>\n";
}

}  // namespace

const char* job_colour(std::size_t i) {
  return kJobColours[i % std::size(kJobColours)];
}

std::string curve_figures(const std::vector<ComparedJob>& jobs) {
  std::string s = curve(
      jobs, "loss", "Training loss", "training loss", [](const ComparedStep& x) { return x.loss; },
      "Lines of equal values lie on top of each other (the first widest).");
  s += val_curve(jobs);
  s += curve(jobs, "grad_norm", "Gradient norm", "gradient norm (before clipping)",
             [](const ComparedStep& x) { return x.grad_norm; });
  s += curve(jobs, "lr", "Learning rate", "learning rate",
             [](const ComparedStep& x) { return x.lr; });
  s += curve(
      jobs, "step_time", "Step time", "step time (s)",
      [](const ComparedStep& x) { return x.step_time_s; }, "The first step includes warm-up.");
  s += curve(jobs, "throughput", "Throughput", "tokens per second (thousands)",
             [](const ComparedStep& x) { return x.tokens_per_s / 1e3; });
  s += curve(jobs, "memory_over_steps", "Peak device memory over steps",
             "peak device memory per rank (MiB)",
             [](const ComparedStep& x) { return static_cast<double>(x.device_peak) / 1048576.0; });
  return s;
}

std::string difference_figures(const std::vector<ComparedJob>& jobs, const std::string& reference,
                               const Tolerance& tol) {
  const ComparedJob* ref = nullptr;
  std::size_t others = 0;
  for (const ComparedJob& j : jobs) {
    if (j.outcome != JobOutcome::completed) continue;
    if (j.strategy == reference)
      ref = &j;
    else
      ++others;
  }
  if (!ref || others == 0) return {};
  const std::string caption = "|x - x_" + reference + "| / |x_" + reference +
                              "| at each step, log scale; dashed red: the tolerance the verdict "
                              "applies.";
  return html::figure("Difference from " + reference + ": loss",
                      difference_chart(jobs, *ref, true, tol.loss) + jobs_legend(jobs, reference),
                      caption) +
         html::figure(
             "Difference from " + reference + ": gradient norm",
             difference_chart(jobs, *ref, false, tol.grad_norm) + jobs_legend(jobs, reference),
             caption);
}

namespace {

// A job's bar on tier `t`: its peak per category; for a job refused
// memory on this tier, what it held then and, hatched, what it asked for.
BarRow memory_row(const ComparedJob& j, Tier t) {
  const std::string tier(tier_name(t));
  if (j.oom && j.oom->tier == tier)
    return {j.strategy,
            {{static_cast<double>(j.oom->in_use), "#8d8d8d",
              "in use when refused: " + format_bytes(j.oom->in_use)},
             {static_cast<double>(j.oom->requested), "#c62828",
              "asked for " + j.oom->category + ": " + format_bytes(j.oom->requested), true}},
            "out of memory: " + format_bytes(j.oom->in_use) + " + " +
                format_bytes(j.oom->requested) + " asked"};
  BarRow r{j.strategy,
           {},
           j.tier_peak[t]    ? format_bytes(j.tier_peak[t])
           : j.steps.empty() ? outcome_name(j.outcome)
                             : "none"};
  for (Category k : kCategories)
    r.segments.push_back({static_cast<double>(j.peak[t][k]),
                          kCategoryColours[static_cast<std::size_t>(k)],
                          std::string(category_name(k)) + ": " + format_bytes(j.peak[t][k])});
  return r;
}

std::string tier_chart(const std::vector<ComparedJob>& jobs, Tier t,
                       std::optional<std::uint64_t> limit) {
  BarChart c;
  c.id = "memory_" + std::string(tier_name(t));
  double most = limit ? static_cast<double>(*limit) : 0;
  for (const ComparedJob& j : jobs) {
    c.rows.push_back(memory_row(j, t));
    double sum = 0;
    for (const Segment& sg : c.rows.back().segments) sum += sg.value;
    most = std::max(most, sum);
  }
  const auto [unit, unit_name] = byte_unit(most);
  c.unit = unit;
  c.x_label = "peak per rank on the " + std::string(tier_name(t)) + " tier (" + unit_name + ")";
  if (limit) {
    c.limit = static_cast<double>(*limit);
    c.limit_label =
        (t == Tier::device ? "[device] memory_limit " : "budget ") + format_bytes(*limit);
  }
  return chart::bar_chart(c);
}

bool tier_used(const std::vector<ComparedJob>& jobs, Tier t) {
  for (const ComparedJob& j : jobs)
    if (j.tier_peak[t] || (j.oom && j.oom->tier == tier_name(t))) return true;
  return t == Tier::device;
}

// The budget line of tier `t`: the device's memory limit, else the budget
// an out-of-memory job was refused against.
std::optional<std::uint64_t> tier_limit(const std::vector<ComparedJob>& jobs, Tier t,
                                        std::optional<std::uint64_t> device_limit) {
  if (t == Tier::device && device_limit) return device_limit;
  for (const ComparedJob& j : jobs)
    if (j.oom && j.oom->tier == tier_name(t) && j.oom->budget) return j.oom->budget;
  return std::nullopt;
}

std::string category_legend(const std::vector<ComparedJob>& jobs) {
  std::vector<std::pair<std::string, std::string>> items;
  for (Category k : kCategories)
    items.emplace_back(category_name(k), kCategoryColours[static_cast<std::size_t>(k)]);
  if (std::any_of(jobs.begin(), jobs.end(), [](const ComparedJob& j) { return j.oom; })) {
    items.emplace_back("in use when refused (out of memory)", "#8d8d8d");
    items.emplace_back("asked for (hatched)", "#c62828");
  }
  return html::legend(items);
}

}  // namespace

std::string memory_figures(const std::vector<ComparedJob>& jobs,
                           std::optional<std::uint64_t> device_limit) {
  std::string s;
  for (Tier t : kTiers)
    if (tier_used(jobs, t))
      s += html::figure("Peak memory per rank: " + std::string(tier_name(t)) + " tier",
                        tier_chart(jobs, t, tier_limit(jobs, t, device_limit)) +
                            (t == Tier::device ? category_legend(jobs) : std::string()));
  return s;
}

std::string comm_figures(const std::vector<ComparedJob>& jobs) {
  BarChart bytes, wait;
  double most = 0;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const ComparedJob& j = jobs[i];
    const JobSummary f = summarize(j);
    const std::string none = j.steps.empty() ? outcome_name(j.outcome) : std::string();
    most = std::max(most, f.bytes_per_step);
    bytes.rows.push_back(
        {j.strategy,
         {{f.bytes_per_step, job_colour(i), "median bytes sent per rank and step"}},
         none.empty() ? format_bytes(static_cast<std::uint64_t>(f.bytes_per_step)) : none});
    wait.rows.push_back({j.strategy,
                         {{f.comm_wait_per_step * 1e3, job_colour(i), "median wait per step"}},
                         none.empty() ? short_number(f.comm_wait_per_step * 1e3) + " ms" : none});
  }
  const auto [unit, unit_name] = byte_unit(most);
  bytes.id = "comm_bytes";
  bytes.unit = unit;
  bytes.x_label = "bytes sent per rank and step, median (" + unit_name + ")";
  wait.id = "comm_wait";
  wait.x_label = "time waited on communication per step, median (ms)";
  return html::figure("Communication per rank and step", chart::bar_chart(bytes)) +
         html::figure("Communication wait per step", chart::bar_chart(wait),
                      "Median over steps of the time a rank waited on collectives.");
}

}  // namespace ztrain
