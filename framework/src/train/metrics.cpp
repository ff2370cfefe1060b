#include "train/metrics.h"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "io/durable_file.h"

#include "ztrain/error.h"

namespace ztrain {

namespace {

// A JSON string, quoted and escaped by nlohmann (the one JSON library);
// bytes that are not UTF-8 (a path may hold any) become U+FFFD rather than
// an exception in the middle of a run.
std::string quoted(std::string_view s) {
  return nlohmann::json(std::string(s))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Now, as RFC 3339 in UTC with milliseconds: "2026-12-03T08:50:01.123Z".
std::string rfc3339_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char text[40];
  const std::size_t n = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(text + n, sizeof text - n, ".%03dZ", static_cast<int>(ms.count()));
  return text;
}

}  // namespace

void JsonLine::key(std::string_view k) {
  if (body_.size() > 1) body_ += ", ";
  body_ += quoted(k) + ": ";
}

JsonLine& JsonLine::add(std::string_view k, double v) {
  key(k);
  if (!std::isfinite(v)) {
    body_ += "null";  // JSON has no NaN or infinity
  } else {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    body_ += buf;
  }
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, const std::vector<double>& v) {
  key(k);
  body_ += "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v[i]);
    body_ += (i ? ", " : "") + std::string(std::isfinite(v[i]) ? buf : "null");
  }
  body_ += "]";
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, std::int64_t v) {
  key(k);
  body_ += std::to_string(v);
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, bool v) {
  key(k);
  body_ += v ? "true" : "false";
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, std::string_view v) {
  key(k);
  body_ += quoted(v);
  return *this;
}

JsonLine& JsonLine::add_memory(std::string_view k, const MemoryStats& stats, bool peak) {
  key(k);
  body_ += "{";
  for (Tier t : kTiers) {
    if (t != Tier::device) body_ += ", ";
    body_ += "\"" + std::string(tier_name(t)) + "\": {";
    for (Category c : kCategories) {
      if (c != Category::params) body_ += ", ";
      const auto v = peak ? stats.peak[t][c] : stats.current[t][c];
      body_ += "\"" + std::string(category_name(c)) + "\": " + std::to_string(v);
    }
    body_ += ", \"total\": " + std::to_string(peak ? stats.tier_peak[t] : stats.tier_current[t]);
    body_ += "}";
  }
  body_ += "}";
  return *this;
}

JsonLine& JsonLine::add_comm(std::string_view k, const CommCounters& counters) {
  key(k);
  body_ += "{";
  for (std::size_t c = 0; c < kCollectiveCount; ++c) {
    if (c) body_ += ", ";
    body_ += "\"" + std::string(collective_name(static_cast<Collective>(c))) +
             "\": {\"calls\": " + std::to_string(counters.calls[c]) +
             ", \"bytes\": " + std::to_string(counters.bytes_sent[c]) + "}";
  }
  body_ += "}";
  return *this;
}

MetricsFile::MetricsFile(const std::filesystem::path& path, bool append) : path_(path) {
  out_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!out_)
    throw Error("cannot write metrics file '" + path.string() +
                "'; check that [train] out_dir is writable");
}

MetricsFile::MetricsFile(const std::filesystem::path& path, std::int64_t step, std::size_t& dropped)
    : path_(path) {
  dropped = 0;
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    // A line cut short (the attempt stopped while writing it) goes too.
    const bool later = !j.is_object() || j.value("step", std::int64_t{0}) > step;
    if (later)
      ++dropped;
    else
      kept += line + "\n";
  }
  if (dropped) write_file_atomically(path, kept);
  out_.open(path, std::ios::out | std::ios::app);
  if (!out_)
    throw Error("cannot write metrics file '" + path.string() +
                "'; check that [train] out_dir is writable");
}

void MetricsFile::write(const JsonLine& line) {
  JsonLine stamped = line;
  stamped.add("time", rfc3339_now())
      .add("elapsed_s",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  // A line is written whole or not at all: a write that fails part-way (a
  // full disk) is cut back off, so the file never ends in half a line.
  const std::streampos before = out_.tellp();
  out_ << stamped.str() << '\n';
  out_.flush();
  if (out_) return;
  std::error_code ec;
  if (before >= 0) std::filesystem::resize_file(path_, static_cast<std::uintmax_t>(before), ec);
  throw Error("writing metrics file '" + path_.string() + "' failed (disk full?)");
}

}  // namespace ztrain
