#include "commands/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ztrain::chart {
namespace {

// Every chart is 1000 units wide; the page scales it to its width.
constexpr double kWidth = 1000;
// Polylines keep this many points at most: 1000 steps of 5 strategies in
// 8 charts stay well under the page's size budget, and no chart is wider
// than this in pixels at its plot area anyway.
constexpr std::size_t kMaxPoints = 320;

// One decimal: a tenth of a unit of a 1000-unit-wide chart.
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string exact(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string text(double x, double y, const std::string& anchor, const std::string& body,
                 const std::string& extra = {}) {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" text-anchor=\"" + anchor + "\"" + extra +
         ">" + escape(body) + "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2, const std::string& cls) {
  return "<line class=\"" + cls + "\" x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" +
         num(x2) + "\" y2=\"" + num(y2) + "\"/>\n";
}

struct Axis {
  double lo = 0, hi = 1;  // values at the ends (log10 of them on a log axis)
  double p0 = 0, p1 = 1;  // pixels at the ends
  bool log = false;
  double floor = 0;  // log axes: values below are drawn here
  double at(double v) const {
    const double u = log ? std::log10(std::max(v, floor)) : v;
    return p0 + (p1 - p0) * (u - lo) / (hi - lo);
  }
};

struct Frame {
  double left = 84, right = 24, top = 14, bottom = 48, height = 300;
  double x0() const { return left; }
  double x1() const { return kWidth - right; }
  double y0() const { return height - bottom; }  // bottom of the plot
  double y1() const { return top; }
};

std::string svg_open(const std::string& id, double height, const std::string& data) {
  return "<svg class=\"chart\" id=\"" + escape(id) + "\" viewBox=\"0 0 " + num(kWidth) + " " +
         num(height) + "\" xmlns=\"http://www.w3.org/2000/svg\"" + data + ">\n";
}

std::string frame_rect(const Frame& f) {
  return "<rect class=\"frame\" x=\"" + num(f.x0()) + "\" y=\"" + num(f.y1()) + "\" width=\"" +
         num(f.x1() - f.x0()) + "\" height=\"" + num(f.y0() - f.y1()) + "\"/>\n";
}

// The y axis of a line chart: its ticks, grid lines and labels.
std::string y_axis(const LineChart& c, const Frame& f, Axis& y, double lo, double hi) {
  std::string s;
  if (c.log_y) {
    const std::vector<double> ticks = decade_ticks(lo, hi);
    y = {std::log10(ticks.front()), std::log10(ticks.back()), f.y0(), f.y1(), true, lo};
    if (y.hi == y.lo) y.hi = y.lo + 1;
    for (double t : ticks) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "1e%d", static_cast<int>(std::lround(std::log10(t))));
      const bool is_floor = !c.floor_label.empty() && t <= lo;
      s += line(f.x0(), y.at(t), f.x1(), y.at(t), "grid");
      s += text(f.x0() - 8, y.at(t) + 4, "end", is_floor ? c.floor_label : std::string(buf));
    }
    return s;
  }
  const Ticks t = nice_ticks(lo, hi, 5);
  y = {t.values.front(), t.values.back(), f.y0(), f.y1(), false, 0};
  for (double v : t.values) {
    s += line(f.x0(), y.at(v), f.x1(), y.at(v), "grid");
    s += text(f.x0() - 8, y.at(v) + 4, "end", tick_label(v, t.step));
  }
  return s;
}

std::string x_axis(const Frame& f, Axis& x, double lo, double hi) {
  Ticks t = nice_ticks(lo, hi, 8);
  // Steps are whole: no tick between two.
  if (t.step < 1) {
    t.step = 1;
    t.values.clear();
    for (double v = std::floor(lo) - (hi == lo); v <= std::ceil(hi) + (hi == lo); ++v)
      t.values.push_back(v);
  }
  x = {t.values.front(), t.values.back(), f.x0(), f.x1(), false, 0};
  std::string s;
  for (double v : t.values) {
    s += line(x.at(v), f.y0(), x.at(v), f.y1(), "grid");
    s += text(x.at(v), f.y0() + 18, "middle", tick_label(v, t.step));
  }
  return s;
}

std::string axis_labels(const Frame& f, const std::string& x_label, const std::string& y_label) {
  const double mid_y = (f.y0() + f.y1()) / 2;
  return text((f.x0() + f.x1()) / 2, f.height - 8, "middle", x_label, " class=\"label\"") +
         text(16, mid_y, "middle", y_label,
              " class=\"label\" transform=\"rotate(-90 16 " + num(mid_y) + ")\"");
}

std::string series_svg(const Series& s, const Axis& x, const Axis& y) {
  const std::vector<Point> pts = decimate(s.points, kMaxPoints);
  std::string points;
  for (const Point& p : pts) points += num(x.at(p.x)) + "," + num(y.at(p.y)) + " ";
  if (!points.empty()) points.pop_back();
  std::string out =
      "<polyline class=\"curve\" data-label=\"" + escape(s.label) + "\" fill=\"none\" stroke=\"" +
      s.colour + "\" stroke-width=\"" + exact(s.width) + "\"" +
      (s.dash ? " stroke-dasharray=\"" + std::to_string(s.dash) + " 4\"" : "") + " points=\"" +
      points + "\"><title>" + escape(s.label) + "</title></polyline>\n";
  // Few points (an evaluation or two, a short run): each one marked.
  if (pts.size() <= 30)
    for (const Point& p : pts)
      out += "<circle cx=\"" + num(x.at(p.x)) + "\" cy=\"" + num(y.at(p.y)) + "\" r=\"" +
             exact(std::max(2.5, s.width)) + "\" fill=\"" + s.colour + "\"/>\n";
  return out;
}

// The data's range on y, values on a log axis clamped to its floor.
std::pair<double, double> y_range(const LineChart& c) {
  double lo = 1e300, hi = -1e300, min_positive = 1e300;
  for (const auto& s : c.series)
    for (const Point& p : s.points) {
      lo = std::min(lo, p.y);
      hi = std::max(hi, p.y);
      if (p.y > 0) min_positive = std::min(min_positive, p.y);
    }
  for (const auto& l : c.lines) {
    lo = std::min(lo, l.y);
    hi = std::max(hi, l.y);
    if (l.y > 0) min_positive = std::min(min_positive, l.y);
  }
  if (!c.log_y) return {lo, hi};
  const double floor = c.log_floor > 0 ? c.log_floor : min_positive;
  return {floor, std::max(hi, floor)};
}

}  // namespace

Ticks nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  Ticks t;
  t.step = 10 * mag;
  for (double m : {1.0, 2.0, 5.0})
    if (m * mag >= raw * (1 - 1e-9)) {
      t.step = m * mag;
      break;
    }
  const auto first = static_cast<long long>(std::floor(lo / t.step + 1e-9));
  const auto last = static_cast<long long>(std::ceil(hi / t.step - 1e-9));
  for (long long k = first; k <= last; ++k) t.values.push_back(static_cast<double>(k) * t.step);
  return t;
}

std::vector<double> decade_ticks(double lo, double hi) {
  const int a = static_cast<int>(std::floor(std::log10(lo) + 1e-9));
  const int b = std::max(a + 1, static_cast<int>(std::ceil(std::log10(hi) - 1e-9)));
  std::vector<double> out;
  for (int e = a; e <= b; ++e) out.push_back(std::pow(10.0, e));
  return out;
}

std::string tick_label(double v, double step) {
  char buf[32];
  if (std::fabs(v) < step * 1e-6) v = 0;
  if (std::fabs(v) >= 1e6 || (v != 0 && std::fabs(v) < 1e-4)) {
    std::snprintf(buf, sizeof buf, "%.3g", v);
    return buf;
  }
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::vector<Point> decimate(const std::vector<Point>& points, std::size_t max_points) {
  if (points.size() <= max_points || max_points < 4) return points;
  const std::size_t buckets = max_points / 2, n = points.size();
  std::vector<Point> out{points.front()};
  for (std::size_t b = 0; b < buckets; ++b) {
    const std::size_t from = std::max<std::size_t>(1, b * n / buckets);
    const std::size_t to = std::min(n - 1, (b + 1) * n / buckets);
    if (from >= to) continue;
    const auto [lo, hi] = std::minmax_element(points.begin() + static_cast<std::ptrdiff_t>(from),
                                              points.begin() + static_cast<std::ptrdiff_t>(to),
                                              [](Point a, Point b2) { return a.y < b2.y; });
    out.push_back(lo->x < hi->x ? *lo : *hi);
    if (lo != hi) out.push_back(lo->x < hi->x ? *hi : *lo);
  }
  out.push_back(points.back());
  return out;
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

std::string line_chart(const LineChart& c) {
  double x_lo = 1e300, x_hi = -1e300;
  for (const auto& s : c.series)
    for (const Point& p : s.points) {
      x_lo = std::min(x_lo, p.x);
      x_hi = std::max(x_hi, p.x);
    }
  if (x_lo > x_hi) return "<p class=\"none\">Nothing was logged for this chart.</p>\n";
  const auto [y_lo, y_hi] = y_range(c);
  const Frame f;
  Axis x, y;
  std::string body = y_axis(c, f, y, y_lo, y_hi) + x_axis(f, x, x_lo, x_hi);
  body += frame_rect(f) + axis_labels(f, c.x_label, c.y_label);
  for (const HLine& l : c.lines) {
    body += "<line class=\"limit\" x1=\"" + num(f.x0()) + "\" y1=\"" + num(y.at(l.y)) + "\" x2=\"" +
            num(f.x1()) + "\" y2=\"" + num(y.at(l.y)) + "\" stroke=\"" + l.colour + "\"/>\n";
    body += text(f.x1() - 4, y.at(l.y) - 5, "end", l.label, " class=\"limit-label\"");
  }
  for (const Series& s : c.series) body += series_svg(s, x, y);
  const std::string data = " data-x-range=\"" + exact(x.lo) + " " + exact(x.hi) +
                           "\" data-y-range=\"" + exact(y.lo) + " " + exact(y.hi) +
                           "\" data-log-y=\"" + (c.log_y ? "1" : "0") + "\"";
  return svg_open(c.id, f.height, data) + body + "</svg>\n";
}

namespace {

std::string bar_row(const BarRow& r, const Axis& x, double y, double row_h,
                    const std::string& hatch) {
  std::string s = text(x.p0 - 8, y + row_h / 2 + 4, "end", r.label);
  double at = 0;
  for (const Segment& sg : r.segments) {
    if (sg.value <= 0) continue;
    s += "<rect class=\"bar" + std::string(sg.hatched ? " asked" : "") + "\" x=\"" + num(x.at(at)) +
         "\" y=\"" + num(y + 4) + "\" width=\"" +
         num(std::max(0.5, x.at(at + sg.value) - x.at(at))) + "\" height=\"" + num(row_h - 8) +
         "\" fill=\"" + (sg.hatched ? "url(#" + hatch + ")" : sg.colour) + "\" stroke=\"" +
         sg.colour + "\"><title>" + escape(sg.title) + "</title></rect>\n";
    at += sg.value;
  }
  return s + text(x.at(at) + 6, y + row_h / 2 + 4, "start", r.note, " class=\"note\"");
}

}  // namespace

std::string bar_chart(const BarChart& c) {
  const double row_h = 28, top = c.limit ? 26 : 8, axis_h = 48;
  const double height = top + row_h * static_cast<double>(c.rows.size()) + axis_h;
  double most = c.limit.value_or(0);
  for (const BarRow& r : c.rows) {
    double sum = 0;
    for (const Segment& sg : r.segments) sum += sg.value;
    most = std::max(most, sum);
  }
  const Ticks t = nice_ticks(0, std::max(most / c.unit, 1e-9), 5);
  const double plot_bottom = top + row_h * static_cast<double>(c.rows.size());
  Axis x{0, t.values.back() * c.unit, 180, kWidth - 230, false, 0};
  const std::string hatch = "hatch-" + c.id;
  std::string s = svg_open(c.id, height, "");
  s += "<defs><pattern id=\"" + escape(hatch) +
       "\" width=\"8\" height=\"8\" patternUnits=\"userSpaceOnUse\" "
       "patternTransform=\"rotate(45)\"><rect width=\"8\" height=\"8\" fill=\"#fff\"/>"
       "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"8\" stroke=\"#c62828\" stroke-width=\"3\"/>"
       "</pattern></defs>\n";
  for (double v : t.values) {
    s += line(x.at(v * c.unit), top, x.at(v * c.unit), plot_bottom, "grid");
    s += text(x.at(v * c.unit), plot_bottom + 18, "middle", tick_label(v, t.step));
  }
  s += text((x.p0 + x.p1) / 2, height - 8, "middle", c.x_label, " class=\"label\"");
  for (std::size_t i = 0; i < c.rows.size(); ++i)
    s += bar_row(c.rows[i], x, top + row_h * static_cast<double>(i), row_h, hatch);
  if (c.limit) {
    s += "<line class=\"limit budget\" x1=\"" + num(x.at(*c.limit)) + "\" y1=\"" + num(top - 6) +
         "\" x2=\"" + num(x.at(*c.limit)) + "\" y2=\"" + num(plot_bottom) +
         "\" stroke=\"#c62828\"/>\n";
    s += text(x.at(*c.limit), top - 10, "middle", c.limit_label, " class=\"limit-label\"");
  }
  return s + "</svg>\n";
}

}  // namespace ztrain::chart
