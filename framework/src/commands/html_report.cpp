#include "commands/html_report.h"

#include <unistd.h>

#include <generated/git_commit.h>  // ZTRAIN_GIT_COMMIT, written at each build
#include <algorithm>
#include <ctime>
#include <fstream>
#include <thread>

#include "commands/svg_chart.h"
#include "ztrain/version.h"

namespace ztrain::html {
namespace {

using chart::escape;

constexpr const char* kStyle = R"(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;margin:0;padding:20px 28px}
h1{font-size:22px;margin:0 0 10px}
h2{font-size:16px;margin:26px 0 4px;padding-bottom:3px;border-bottom:1px solid #ddd}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 18px;font-size:13px;margin:0 0 12px}
dl.facts dt{color:#666}dl.facts dd{margin:0;overflow-wrap:anywhere}
dl.facts dd code{font-size:12px}
.verdict{padding:10px 14px;border-left:6px solid;margin:12px 0;font-weight:600;overflow-wrap:anywhere}
.green{background:#e7f4e5;border-color:#2e7d32}.amber{background:#fff3d4;border-color:#d08700}
.red{background:#fde5e5;border-color:#c62828}.neutral{background:#eef2f7;border-color:#5b7083}
table.data{border-collapse:collapse;width:100%;font-size:13px;margin:6px 0}
table.data th,table.data td{padding:4px 6px;border-bottom:1px solid #e2e2e2;text-align:left}
table.data th{background:#f3f3f3;vertical-align:bottom;font-weight:600;white-space:normal}
table.data .num{text-align:right;font-variant-numeric:tabular-nums}
table.data td.num{white-space:nowrap}
table.data td.best{font-weight:700;background:#e3f0ff}
table.data tr.error td{white-space:normal;overflow-wrap:anywhere;color:#8a1c1c;background:#fff6f6;font-size:12px}
p.key{font-size:12px;color:#555;margin:2px 0}
figure{margin:8px 0 18px}figcaption{font-size:12px;color:#555;margin-top:2px}
svg.chart{width:100%;height:auto;display:block;font-size:13px}
svg.chart text{fill:#333}svg.chart text.label{font-size:14px;fill:#111}
svg.chart text.note{font-size:12px}svg.chart text.limit-label{font-size:12px;fill:#c62828}
svg.chart .grid{stroke:#e6e6e6}svg.chart .frame{fill:none;stroke:#999}
svg.chart .limit{stroke-width:1.5;stroke-dasharray:6 4}
.legend span{display:inline-block;margin-right:16px;font-size:13px}
.legend i{display:inline-block;width:18px;height:4px;margin-right:6px;vertical-align:middle}
pre.config{background:#f6f6f6;padding:8px;font-size:11px;white-space:pre-wrap;overflow-wrap:anywhere}
@media print{body{padding:0;font-size:11px}figure,table.data tr{break-inside:avoid}
h2{break-after:avoid}*{-webkit-print-color-adjust:exact;print-color-adjust:exact}}
)";

std::string host_name() {
  char buf[256] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : "unknown";
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string model = "unknown";
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " threads";
}

std::string now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %z", &tm);
  return buf;
}

// The lowest or highest value of column `c` over `rows`, when they differ.
std::optional<double> best_of(const std::vector<Row>& rows, std::size_t c, Best best) {
  std::optional<double> lo, hi;
  for (const Row& r : rows) {
    if (c >= r.cells.size() || !r.cells[c].value) continue;
    const double v = *r.cells[c].value;
    lo = lo ? std::min(*lo, v) : v;
    hi = hi ? std::max(*hi, v) : v;
  }
  if (!lo || *lo == *hi || best == Best::none) return std::nullopt;
  return best == Best::lowest ? lo : hi;
}

}  // namespace

Facts machine_facts(const std::string& command_line) {
  return {{"ztrain", std::string(ZTRAIN_VERSION) + " (commit " + ZTRAIN_GIT_COMMIT + ")"},
          {"host", host_name()},
          {"CPU", cpu_name()},
          {"date", now()},
          {"command", command_line}};
}

std::string command_line(int argc, const char* const* argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    const bool plain = !a.empty() && a.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLM"
                                         "NOPQRSTUVWXYZ0123456789-_./=,:+@%") == std::string::npos;
    std::string quoted = "'";
    for (char ch : a) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    out += (i ? " " : "") + (plain ? a : quoted + "'");
  }
  return out;
}

std::string page_begin(const std::string& title, const std::string& heading) {
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
         "<meta name=\"viewport\" content=\"width=device-width\"><title>" +
         escape(title) + "</title>\n<style>" + kStyle + "</style></head><body>\n<h1>" +
         escape(heading) + "</h1>\n";
}

std::string page_end() {
  return "</body></html>\n";
}

std::string facts_block(const Facts& facts) {
  std::string s = "<dl class=\"facts\" id=\"facts\">\n";
  for (const auto& [k, v] : facts)
    s += "<dt>" + escape(k) + "</dt><dd>" + (k == "command" ? "<code>" : "") + escape(v) +
         (k == "command" ? "</code>" : "") + "</dd>\n";
  return s + "</dl>\n";
}

std::string banner(Level level, const std::string& text) {
  static const char* names[] = {"green", "amber", "red", "neutral"};
  return "<p id=\"verdict\" class=\"verdict " + std::string(names[static_cast<int>(level)]) +
         "\">" + escape(text) + "</p>\n";
}

std::string table(const std::string& id, const std::vector<Column>& columns,
                  const std::vector<Row>& rows) {
  std::string s = "<table class=\"data\" id=\"" + escape(id) + "\">\n<thead><tr>";
  for (const Column& c : columns)
    s += "<th" + std::string(c.numeric ? " class=\"num\"" : "") + ">" + escape(c.header) + "</th>";
  s += "</tr></thead>\n<tbody>\n";
  std::vector<std::optional<double>> best;
  for (std::size_t c = 0; c < columns.size(); ++c)
    best.push_back(best_of(rows, c, columns[c].best));
  for (const Row& r : rows) {
    s += "<tr>";
    for (std::size_t c = 0; c < columns.size(); ++c) {
      const Cell cell = c < r.cells.size() ? r.cells[c] : Cell{"", std::nullopt};
      const bool is_best = best[c] && cell.value && *cell.value == *best[c];
      std::string cls = columns[c].numeric ? "num" : "";
      if (is_best) cls += cls.empty() ? "best" : " best";
      s += "<td" + (cls.empty() ? std::string() : " class=\"" + cls + "\"") +
           (is_best ? " title=\"best of the column\"" : "") + ">" + escape(cell.text) + "</td>";
    }
    s += "</tr>\n";
    if (!r.error.empty())
      s += "<tr class=\"error\"><td colspan=\"" + std::to_string(columns.size()) + "\">" +
           escape(r.error) + "</td></tr>\n";
  }
  return s + "</tbody></table>\n<p class=\"key\">Shaded bold: the best value of its column " +
         "(lowest time, loss, bytes and memory; highest throughput).</p>\n";
}

std::string legend(const std::vector<std::pair<std::string, std::string>>& names_and_colours) {
  std::string s = "<p class=\"legend\">";
  for (const auto& [name, colour] : names_and_colours)
    s += "<span><i style=\"background:" + colour + "\"></i>" + escape(name) + "</span>";
  return s + "</p>\n";
}

std::string figure(const std::string& heading, const std::string& chart,
                   const std::string& caption) {
  return "<figure><h2>" + escape(heading) + "</h2>\n" + chart +
         (caption.empty() ? std::string() : "<figcaption>" + escape(caption) + "</figcaption>") +
         "</figure>\n";
}

}  // namespace ztrain::html
