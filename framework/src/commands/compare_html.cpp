// The comparison as one self-contained HTML page: the verdict, the table,
// and four charts drawn as inline SVG (no script, nothing fetched): the
// loss curves overlaid, step times (median bar, min-max whisker), peak
// memory per rank as stacked bars per tier and category, and bytes sent
// per step with the time waited on communication.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "commands/compare_report.h"
#include "ztrain/units.h"

namespace ztrain {
namespace {

constexpr const char* kJobColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                       "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};
constexpr const char* kCategoryColours[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                            "#59a14f", "#edc948", "#b07aa1"};
static_assert(std::size(kCategoryColours) == kCategoryCount);
const char* colour(Category c) {
  return kCategoryColours[static_cast<std::size_t>(c)];
}

const char* job_colour(std::size_t i) {
  return kJobColours[i % std::size(kJobColours)];
}

std::string escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// The loss curves of every job that logged steps, on shared axes.
std::string loss_chart(const Comparison& c) {
  const double W = 760, H = 320, left = 60, right = 150, top = 20, bottom = 40;
  double lo = 1e300, hi = -1e300;
  std::int64_t last = 1;
  for (const auto& j : c.jobs)
    for (const auto& s : j.steps) {
      lo = std::min(lo, s.loss);
      hi = std::max(hi, s.loss);
      last = std::max(last, s.step);
    }
  if (lo > hi) return "<p>No job logged a step.</p>\n";
  if (hi == lo) hi = lo + 1;
  const auto x = [&](double step) {
    return left + (W - left - right) * (last > 1 ? (step - 1) / static_cast<double>(last - 1) : 0);
  };
  const auto y = [&](double loss) { return top + (H - top - bottom) * (hi - loss) / (hi - lo); };
  std::string s = "<svg class=\"chart\" id=\"loss\" width=\"" + num(W) + "\" height=\"" + num(H) +
                  "\" xmlns=\"http://www.w3.org/2000/svg\">\n";
  s += "<line x1=\"" + num(left) + "\" y1=\"" + num(H - bottom) + "\" x2=\"" + num(W - right) +
       "\" y2=\"" + num(H - bottom) + "\" stroke=\"#333\"/>\n";
  s += "<line x1=\"" + num(left) + "\" y1=\"" + num(top) + "\" x2=\"" + num(left) + "\" y2=\"" +
       num(H - bottom) + "\" stroke=\"#333\"/>\n";
  for (double v : {lo, (lo + hi) / 2, hi})
    s += "<text x=\"" + num(left - 6) + "\" y=\"" + num(y(v) + 4) +
         "\" text-anchor=\"end\" font-size=\"11\">" + short_number(v) + "</text>\n";
  for (std::int64_t st : {std::int64_t{1}, (last + 1) / 2, last})
    s += "<text x=\"" + num(x(static_cast<double>(st))) + "\" y=\"" + num(H - bottom + 16) +
         "\" text-anchor=\"middle\" font-size=\"11\">" + std::to_string(st) + "</text>\n";
  s += "<text x=\"" + num((left + W - right) / 2) + "\" y=\"" + num(H - 6) +
       "\" text-anchor=\"middle\" font-size=\"12\">step</text>\n";
  for (std::size_t i = 0; i < c.jobs.size(); ++i) {
    const auto& j = c.jobs[i];
    if (j.steps.empty()) continue;
    std::string points;
    for (const auto& st : j.steps)
      points += num(x(static_cast<double>(st.step))) + "," + num(y(st.loss)) + " ";
    // Later jobs dashed, so overlaid equal curves stay visible.
    s += "<polyline class=\"curve\" fill=\"none\" stroke=\"" + std::string(job_colour(i)) +
         "\" stroke-width=\"2\"" +
         (i ? " stroke-dasharray=\"" + std::to_string(3 + 2 * i) + ",4\"" : "") + " points=\"" +
         points + "\"><title>" + escape(j.strategy) + "</title></polyline>\n";
    const double ly = top + 16 * static_cast<double>(i);
    s += "<rect x=\"" + num(W - right + 12) + "\" y=\"" + num(ly) +
         "\" width=\"14\" height=\"4\" fill=\"" + job_colour(i) + "\"/><text x=\"" +
         num(W - right + 30) + "\" y=\"" + num(ly + 6) + "\" font-size=\"12\">" +
         escape(j.strategy) + "</text>\n";
  }
  return s + "</svg>\n";
}

struct Segment {
  double value;
  std::string colour, title;
};
struct BarRow {
  std::string label;
  std::vector<Segment> segments;
  double whisker_lo = -1, whisker_hi = -1;  // drawn when >= 0
  std::string note;                         // right of the bar
};

// Horizontal bars, one row each, segments stacked, on a shared scale.
std::string bar_chart(const std::string& id, const std::vector<BarRow>& rows) {
  const double W = 760, left = 170, right = 190, row_h = 24;
  double top_value = 0;
  for (const auto& r : rows) {
    double sum = 0;
    for (const auto& sg : r.segments) sum += sg.value;
    top_value = std::max({top_value, sum, r.whisker_hi});
  }
  if (top_value <= 0) top_value = 1;
  const double H = row_h * static_cast<double>(rows.size()) + 10;
  const auto x = [&](double v) { return left + (W - left - right) * v / top_value; };
  std::string s = "<svg class=\"chart\" id=\"" + id + "\" width=\"" + num(W) + "\" height=\"" +
                  num(H) + "\" xmlns=\"http://www.w3.org/2000/svg\">\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const double y = 5 + row_h * static_cast<double>(i);
    s += "<text x=\"" + num(left - 8) + "\" y=\"" + num(y + 15) +
         "\" text-anchor=\"end\" font-size=\"12\">" + escape(r.label) + "</text>\n";
    double at = 0;
    for (const auto& sg : r.segments) {
      if (sg.value <= 0) continue;
      s += "<rect class=\"bar\" x=\"" + num(x(at)) + "\" y=\"" + num(y + 3) + "\" width=\"" +
           num(x(at + sg.value) - x(at)) + "\" height=\"" + num(row_h - 8) + "\" fill=\"" +
           sg.colour + "\"><title>" + escape(sg.title) + "</title></rect>\n";
      at += sg.value;
    }
    if (r.whisker_lo >= 0)
      s += "<line x1=\"" + num(x(r.whisker_lo)) + "\" y1=\"" + num(y + row_h / 2 - 1) + "\" x2=\"" +
           num(x(r.whisker_hi)) + "\" y2=\"" + num(y + row_h / 2 - 1) + "\" stroke=\"#000\"/>\n";
    s += "<text x=\"" + num(std::max(x(at), r.whisker_hi >= 0 ? x(r.whisker_hi) : 0) + 6) +
         "\" y=\"" + num(y + 15) + "\" font-size=\"11\">" + escape(r.note) + "</text>\n";
  }
  return s + "</svg>\n";
}

std::string step_time_chart(const Comparison& c) {
  std::vector<BarRow> rows;
  for (std::size_t i = 0; i < c.jobs.size(); ++i) {
    const auto& j = c.jobs[i];
    if (j.steps.empty()) {
      rows.push_back({j.strategy, {}, -1, -1, outcome_name(j.outcome)});
      continue;
    }
    const JobSummary f = summarize(j);
    rows.push_back(
        {j.strategy,
         {{f.step_median, job_colour(i), "median " + short_number(f.step_median) + " s"}},
         f.step_min,
         f.step_max,
         short_number(f.step_median) + " s"});
  }
  return bar_chart("step_time", rows);
}

std::string memory_chart(const Comparison& c) {
  std::vector<BarRow> rows;
  for (const auto& j : c.jobs) {
    bool any = false;
    for (Tier t : kTiers) {
      if (!j.tier_peak[t]) continue;
      any = true;
      BarRow r{
          j.strategy + " " + std::string(tier_name(t)), {}, -1, -1, format_bytes(j.tier_peak[t])};
      for (Category k : kCategories)
        r.segments.push_back({static_cast<double>(j.peak[t][k]), colour(k),
                              std::string(category_name(k)) + " " + format_bytes(j.peak[t][k])});
      rows.push_back(std::move(r));
    }
    if (!any) rows.push_back({j.strategy, {}, -1, -1, outcome_name(j.outcome)});
  }
  std::string legend = "<p class=\"legend\">";
  for (Category k : kCategories)
    legend += "<span style=\"background:" + std::string(colour(k)) + "\"></span>" +
              std::string(category_name(k)) + " ";
  return bar_chart("memory", rows) + legend + "</p>\n";
}

std::string comm_chart(const Comparison& c) {
  std::vector<BarRow> rows;
  for (std::size_t i = 0; i < c.jobs.size(); ++i) {
    const auto& j = c.jobs[i];
    const JobSummary f = summarize(j);
    rows.push_back({j.strategy,
                    {{f.bytes_per_step, job_colour(i), "bytes sent per rank and step"}},
                    -1,
                    -1,
                    j.steps.empty() ? outcome_name(j.outcome)
                                    : format_bytes(static_cast<std::uint64_t>(f.bytes_per_step)) +
                                          ", waited " + short_number(f.comm_wait_per_step) + " s"});
  }
  return bar_chart("comm", rows);
}

}  // namespace

std::string comparison_html(const Comparison& c) {
  std::string s = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>ztrain compare: " +
                  escape(c.run_file) +
                  "</title>\n<style>body{font-family:sans-serif;margin:24px;max-width:1100px}"
                  "pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px}"
                  ".ok{background:#e3f5e1;padding:8px;border-left:6px solid #2ca02c}"
                  ".bad{background:#fbe3e3;padding:8px;border-left:6px solid #d62728}"
                  ".legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 10px}"
                  "</style></head><body>\n";
  s += "<h1>ztrain compare</h1>\n<p>" + escape(c.run_file) + ": " + std::to_string(c.steps) +
       " steps, " + std::to_string(c.ranks) + (c.ranks == 1 ? " rank" : " ranks") + ", " +
       escape(c.precision) + "</p>\n";
  s += "<p id=\"verdict\" class=\"" + std::string(c.verdict.equivalent ? "ok" : "bad") + "\">" +
       (c.verdict.equivalent ? "" : "FAILED: ") + escape(c.verdict.message) + "</p>\n";
  s += "<pre>" + escape(comparison_table(c)) + "</pre>\n";
  s += "<h2>Training loss</h2>\n" + loss_chart(c);
  s += "<h2>Step time (median; line: min to max)</h2>\n" + step_time_chart(c);
  s += "<h2>Peak memory per rank, by tier and category</h2>\n" + memory_chart(c);
  s += "<h2>Communication per rank and step</h2>\n" + comm_chart(c);
  return s + "</body></html>\n";
}

}  // namespace ztrain
