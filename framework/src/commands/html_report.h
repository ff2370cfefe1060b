// The parts of ztrain's self-contained HTML report pages (`ztrain compare`,
// `ztrain report`): the page shell (inline CSS, full width, @media print,
// no script, nothing fetched), the metadata block (what was run, where,
// when, by which build), a verdict banner (green, amber, red), a table
// with units in its headers, numbers right-aligned, the best value of
// each column marked and errors in full-width wrapping rows, and a legend.
//
// Thread safety: pure functions, except machine_facts, which reads the
// host's name, /proc/cpuinfo and the clock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ztrain::html {

using Facts = std::vector<std::pair<std::string, std::string>>;

// The ztrain version and git commit (at build time; "unknown" outside
// git), the host and CPU, the date, and `command_line`.
Facts machine_facts(const std::string& command_line);

// argv as one shell-quoted line.
std::string command_line(int argc, const char* const* argv);

std::string page_begin(const std::string& title, const std::string& heading);
std::string page_end();
std::string facts_block(const Facts& facts);

enum class Level : std::uint8_t { green, amber, red, neutral };
// <p id="verdict" class="verdict LEVEL">text</p>
std::string banner(Level level, const std::string& text);

// A table column; `best` marks the lowest or highest number of the column
// when the rows' numbers differ.
enum class Best : std::uint8_t { none, lowest, highest };
struct Column {
  std::string header;  // with its unit: "step (s)"
  bool numeric = true;
  Best best = Best::none;
};
struct Cell {
  std::string text;             // shown
  std::optional<double> value;  // compared for the best mark
};
struct Row {
  std::vector<Cell> cells;
  std::string error;  // a full-width row below, wrapped; empty: none
};
std::string table(const std::string& id, const std::vector<Column>& columns,
                  const std::vector<Row>& rows);

// Coloured swatches with names, one per series.
std::string legend(const std::vector<std::pair<std::string, std::string>>& names_and_colours);

// A figure: a heading, the chart, a caption saying how to read it.
std::string figure(const std::string& heading, const std::string& chart,
                   const std::string& caption = {});

}  // namespace ztrain::html
