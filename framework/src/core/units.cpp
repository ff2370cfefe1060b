#include "ztrain/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

#include "ztrain/error.h"

namespace ztrain {
namespace {

struct Unit {
  const char* suffix;
  double factor;
};

bool parse_number(std::string_view text, double& value, std::string_view& rest) {
  const std::string s(text);
  std::size_t used = 0;
  try {
    value = std::stod(s, &used);
  } catch (const std::exception&) {
    return false;
  }
  rest = text.substr(used);
  while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.front())))
    rest.remove_prefix(1);
  return true;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::uint64_t size_from_number(double value) {
  if (!std::isfinite(value) || value < 0 || value > 1.8e19 || value != std::floor(value))
    throw ConfigError("size " + std::to_string(value) +
                      " is not a whole, non-negative number of bytes");
  return static_cast<std::uint64_t>(value);
}

std::uint64_t parse_size(std::string_view text) {
  static const Unit units[] = {{"", 1},
                               {"b", 1},
                               {"kib", 1024.0},
                               {"mib", 1048576.0},
                               {"gib", 1073741824.0},
                               {"tib", 1099511627776.0},
                               {"kb", 1e3},
                               {"mb", 1e6},
                               {"gb", 1e9},
                               {"tb", 1e12}};
  double value = 0;
  std::string_view rest;
  if (parse_number(text, value, rest)) {
    const std::string suffix = lower(rest);
    for (const auto& u : units)
      if (suffix == u.suffix) return size_from_number(std::round(value * u.factor));
  }
  throw ConfigError("'" + std::string(text) +
                    "' is not a size: write a number of bytes (5e8) or a number with a unit "
                    "(512KiB, 2GiB, 1.5GB)");
}

double parse_duration(std::string_view text) {
  static const Unit units[] = {{"", 1},   {"s", 1},    {"ms", 1e-3},
                               {"m", 60}, {"min", 60}, {"h", 3600}};
  double value = 0;
  std::string_view rest;
  if (parse_number(text, value, rest) && value >= 0 && std::isfinite(value)) {
    const std::string suffix = lower(rest);
    for (const auto& u : units)
      if (suffix == u.suffix) return value * u.factor;
  }
  throw ConfigError("'" + std::string(text) +
                    "' is not a duration: write seconds (300) or a number with a unit "
                    "(250ms, 300s, 5m, 1h)");
}

std::string format_bytes(std::uint64_t bytes) {
  static const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, names[u]);
  return buf;
}

}  // namespace ztrain
