// A small chart toolkit for ztrain's HTML reports: "nice" axis ticks,
// polyline decimation, and two chart kinds drawn as inline SVG (no script,
// nothing fetched): lines over steps (linear or log y, with horizontal
// reference lines) and horizontal stacked bars (with a vertical limit
// line). Every chart scales to the page's width (a viewBox, width 100%).
//
// The plot area is a <rect class="frame"> and the <svg> carries its axis
// ranges (data-x-range, data-y-range, data-log-y), so a reader (a test) can
// map a point's pixel coordinates back to the values drawn.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ztrain::chart {

// Ticks of a linear axis covering [lo, hi]: multiples of a step of 1, 2 or
// 5 times a power of ten, chosen for about `target` intervals; the first
// tick is <= lo and the last >= hi. lo == hi widens to a range around it.
struct Ticks {
  std::vector<double> values;
  double step = 0;
};
Ticks nice_ticks(double lo, double hi, int target = 5);

// The powers of ten covering [lo, hi], for a log axis (0 < lo <= hi).
std::vector<double> decade_ticks(double lo, double hi);

// A tick's label: as many decimals as `step` needs, none for integers.
std::string tick_label(double v, double step);

struct Point {
  double x = 0, y = 0;
};

// At most about `max_points` of `points` (in x order), keeping the first
// and last and, in each of max_points / 2 buckets, the lowest and highest
// point, so spikes survive.
std::vector<Point> decimate(const std::vector<Point>& points, std::size_t max_points);

// Text for HTML and SVG: <, >, & and " escaped.
std::string escape(const std::string& s);

struct Series {
  std::string label, colour;
  std::vector<Point> points;
  double width = 2;  // stroke width
  int dash = 0;      // dash length; 0: solid
};
struct HLine {
  double y = 0;
  std::string label, colour;
};
struct LineChart {
  std::string id, x_label, y_label;
  std::vector<Series> series;
  std::vector<HLine> lines;
  bool log_y = false;
  // Log axes: values at or below the floor are drawn on it (the caller
  // says why in its caption); 0: the smallest positive value drawn.
  double log_floor = 0;
  std::string floor_label;  // the floor's tick label when set (e.g. "0")
};
std::string line_chart(const LineChart& c);

struct Segment {
  double value = 0;
  std::string colour, title;
  bool hatched = false;  // an amount asked for, not held
};
struct BarRow {
  std::string label;
  std::vector<Segment> segments;  // stacked left to right
  std::string note;               // right of the bar
};
struct BarChart {
  std::string id, x_label;
  std::vector<BarRow> rows;
  std::optional<double> limit;  // a vertical dashed line
  std::string limit_label;
  double unit = 1;  // tick labels show value / unit
};
std::string bar_chart(const BarChart& c);

}  // namespace ztrain::chart
