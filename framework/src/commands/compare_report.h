// What `ztrain compare` found: each strategy's job read back from its
// metrics, the equivalence verdict, and the table in its four forms
// (console, CSV, JSON, a self-contained HTML page with inline SVG charts).
//
// The verdict: every completed job's loss and gradient-norm curves are
// compared step by step with the reference job's (ddp when it completed,
// else the first completed), each within the tolerance the test suite pins
// for strategies at one world size and precision (relative; fp32 1e-6 on
// losses and 2e-6 on norms, bf16 and fp16 2e-4 and 4e-3). The first step
// outside it fails the verdict, naming the step, the two strategies and
// both values. Jobs that did not complete are not compared; they are
// listed with what stopped them.
//
// Thread safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ztrain/device.h"

namespace ztrain {

struct ComparedStep {
  std::int64_t step = 0;
  double loss = 0, grad_norm = 0, step_time_s = 0, tokens_per_s = 0, flops_per_s = 0;
  double comm_wait_s = 0, lr = 0;
  std::uint64_t bytes_sent = 0;   // per rank
  std::uint64_t device_peak = 0;  // the device tier's peak so far, per rank
};

// What an out-of-memory job was refused, read from its error: the tier and
// category, the bytes asked for, in use then, and the tier's budget.
struct OomRecord {
  std::string tier, category;
  std::uint64_t requested = 0, in_use = 0, budget = 0;
};
std::optional<OomRecord> parse_oom(const std::string& error);

enum class JobOutcome : std::uint8_t { completed, out_of_memory, failed };

struct ComparedJob {
  std::string strategy;
  JobOutcome outcome = JobOutcome::completed;
  std::string error;  // what stopped it (its last error line)
  std::vector<ComparedStep> steps;
  std::optional<double> val_loss;                          // the last evaluation's
  std::vector<std::pair<std::int64_t, double>> val_curve;  // (step, loss)
  std::optional<OomRecord> oom;
  std::int64_t skipped_steps = 0;
  // Peak bytes per rank (the largest over ranks), per tier and category,
  // and per tier.
  TierTable peak;
  PerTier<std::uint64_t> tier_peak;
};

// One job's summary figures. Medians are over the steps after the first
// (which pays for warm-up) when there are such steps.
struct JobSummary {
  double step_median = 0, step_min = 0, step_max = 0;
  double tokens_per_s = 0, flops_per_s = 0, bytes_per_step = 0, comm_wait_per_step = 0;
};
JobSummary summarize(const ComparedJob& job);

struct Tolerance {
  double loss = 0, grad_norm = 0;
};
Tolerance tolerance_for(const std::string& precision);

struct Verdict {
  bool equivalent = true;
  std::string reference;  // empty: no job completed
  std::string message;    // one line
};
Verdict equivalence(const std::vector<ComparedJob>& jobs, const Tolerance& tol);

struct Comparison {
  std::string run_file, precision;
  // For the page: what was run and where (html_report.h's machine facts
  // with the model and data), and the [device] memory_limit.
  std::vector<std::pair<std::string, std::string>> facts;
  std::optional<std::uint64_t> device_limit;
  int ranks = 1;
  std::string mesh;  // the [parallel] degrees above 1 ("context 2 x sequence 2"); empty: data only
  std::int64_t steps = 0;
  Tolerance tolerance;
  std::vector<ComparedJob> jobs;
  Verdict verdict;
};

// A job's metrics.jsonl read back (steps, val loss, peaks, skipped steps).
// A last line cut short (no newline, not JSON: the run stopped while
// writing it, on a full disk or a kill) is left out, and the return says
// so; any other line that is not a metrics record is a DataError naming
// the file and line.
bool read_job_metrics(const std::filesystem::path& metrics, ComparedJob& job);

std::string outcome_name(JobOutcome o);
std::string comparison_table(const Comparison& c);
std::string comparison_csv(const Comparison& c);
std::string comparison_json(const Comparison& c);
std::string comparison_html(const Comparison& c);

}  // namespace ztrain
