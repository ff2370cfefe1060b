// The report charts' axis ticks (commands/svg_chart.h): steps of 1, 2 or 5
// times a power of ten covering the data, decades on log axes, labels with
// the decimals the step needs, and decimation that keeps spikes.
#include <doctest/doctest.h>

#include "commands/svg_chart.h"

using namespace ztrain::chart;

TEST_CASE("nice ticks step by 1, 2 or 5 times a power of ten and cover the range") {
  const Ticks a = nice_ticks(5.4, 5.6, 5);
  CHECK(a.step == doctest::Approx(0.05));
  CHECK(a.values.front() <= 5.4);
  CHECK(a.values.back() >= 5.6);
  CHECK(a.values.size() == 5);
  const Ticks b = nice_ticks(0, 1000, 5);
  CHECK(b.step == doctest::Approx(200));
  CHECK(b.values == std::vector<double>{0, 200, 400, 600, 800, 1000});
  const Ticks c = nice_ticks(1, 6, 8);
  CHECK(c.step == doctest::Approx(1));
  CHECK(c.values.front() == 1);
  CHECK(c.values.back() == 6);
  const Ticks d = nice_ticks(0.0013, 0.0091, 4);
  CHECK(d.step == doctest::Approx(0.002));
  // One value: a range around it, not a division by zero.
  const Ticks e = nice_ticks(3, 3, 5);
  CHECK(e.values.front() < 3);
  CHECK(e.values.back() > 3);
}

TEST_CASE("decade ticks cover a log range, at least one decade") {
  CHECK(decade_ticks(1e-7, 1e-6) == std::vector<double>{1e-7, 1e-6});
  const auto t = decade_ticks(2e-9, 3e-6);
  REQUIRE(t.size() == 5);
  CHECK(t.front() == doctest::Approx(1e-9));
  CHECK(t.back() == doctest::Approx(1e-5));
  CHECK(decade_ticks(1e-3, 1e-3).size() == 2);
}

TEST_CASE("tick labels have the decimals the step needs") {
  CHECK(tick_label(5.45, 0.05) == "5.45");
  CHECK(tick_label(200, 200) == "200");
  CHECK(tick_label(0.30000000000000004, 0.1) == "0.3");
  CHECK(tick_label(1e-17, 0.1) == "0.0");
  CHECK(tick_label(2e7, 1e7) == "2e+07");
}

TEST_CASE("decimation keeps the ends and each bucket's extremes") {
  std::vector<Point> pts;
  for (int i = 0; i < 1000; ++i) pts.push_back({static_cast<double>(i), i == 537 ? 99.0 : 1.0});
  const auto out = decimate(pts, 100);
  CHECK(out.size() <= 102);
  CHECK(out.front().x == 0);
  CHECK(out.back().x == 999);
  bool spike = false;
  for (const Point& p : out) spike = spike || p.y == 99.0;
  CHECK(spike);
  CHECK(decimate(pts, 2000).size() == 1000);
}

TEST_CASE("escape makes text safe for HTML and SVG") {
  CHECK(escape("a<b & \"c\">") == "a&lt;b &amp; &quot;c&quot;&gt;");
}
