// Metrics: one JSON object per line in <out_dir>/metrics.jsonl, written for
// every logged step and every evaluation (marked "split": "val"), flushed as
// it goes so a crashed run keeps what it logged. Every line ends with when
// it was written: "time", UTC in RFC 3339 with milliseconds
// ("2026-12-03T08:50:01.123Z"), and "elapsed_s", seconds since this run
// (or this resumed attempt) opened the file.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/device.h"

namespace ztrain {

// Builds one JSON object; keys are written in call order, laid out as
// `{"key": value, ...}` (one line, greppable). Strings are quoted and
// escaped by nlohmann's JSON, the one JSON library; doubles are written
// with 9 significant digits (a loss is an f32's, which 9 digits give back
// exactly; times and rates need no more), non-finite ones as null.
class JsonLine {
 public:
  JsonLine& add(std::string_view key, double v);
  JsonLine& add(std::string_view key, std::int64_t v);
  JsonLine& add(std::string_view key, bool v);
  JsonLine& add(std::string_view key, std::string_view v);
  // Without it a string literal would pick the bool overload.
  JsonLine& add(std::string_view key, const char* v) { return add(key, std::string_view(v)); }
  // [v0, v1, ...], each as add(double) writes it.
  JsonLine& add(std::string_view key, const std::vector<double>& v);
  // {"device": {"params": bytes, ...}, "host": {...}} of the peaks.
  JsonLine& add_memory(std::string_view key, const MemoryStats& stats, bool peak);
  // {"all_reduce": {"calls": n, "bytes": b}, ...} for every collective kind.
  JsonLine& add_comm(std::string_view key, const CommCounters& counters);
  std::string str() const { return body_ + "}"; }

 private:
  void key(std::string_view k);
  std::string body_ = "{";
};

class MetricsFile {
 public:
  // A resumed run appends to its run's file; a new one starts it.
  explicit MetricsFile(const std::filesystem::path& path, bool append = false);
  // A run resumed at `step` appends after the lines of the steps up to it:
  // the file's later lines (the attempt that went on past its checkpoint
  // before it was stopped or killed) are dropped, since the resumed run
  // logs those steps again, and so is a line cut short. `dropped` receives
  // how many lines went.
  MetricsFile(const std::filesystem::path& path, std::int64_t step, std::size_t& dropped);
  // `line` with its time stamps, whole: a write that fails (a full disk)
  // leaves the file as it was and raises Error.
  void write(const JsonLine& line);
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::ofstream out_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace ztrain
