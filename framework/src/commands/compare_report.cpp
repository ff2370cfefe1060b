#include "commands/compare_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "io/durable_file.h"
#include "train/progress.h"
#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain {
namespace {

using nlohmann::json;

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// |a - b| relative to b (absolute where b is 0).
double relative(double a, double b) {
  return b == 0 ? std::fabs(a) : std::fabs(a - b) / std::fabs(b);
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string general(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// The first step where `job` leaves `ref`'s curves, as a failure message;
// empty when it does not.
std::string first_difference(const ComparedJob& job, const ComparedJob& ref, const Tolerance& tol) {
  if (job.steps.size() != ref.steps.size())
    return job.strategy + " logged " + std::to_string(job.steps.size()) + " steps, " +
           ref.strategy + " " + std::to_string(ref.steps.size());
  for (std::size_t i = 0; i < job.steps.size(); ++i) {
    const ComparedStep &a = job.steps[i], &b = ref.steps[i];
    const double dl = relative(a.loss, b.loss), dn = relative(a.grad_norm, b.grad_norm);
    const bool loss_bad = !(dl <= tol.loss), norm_bad = !(dn <= tol.grad_norm);
    if (!loss_bad && !norm_bad) continue;
    const bool by_loss = loss_bad;
    return job.strategy + " differs from " + ref.strategy + " first at step " +
           std::to_string(a.step) + ": " + (by_loss ? "loss " : "gradient norm ") +
           general(by_loss ? a.loss : a.grad_norm) + " against " +
           general(by_loss ? b.loss : b.grad_norm) + " (relative " + general(by_loss ? dl : dn) +
           ", tolerance " + general(by_loss ? tol.loss : tol.grad_norm) + ")";
  }
  return {};
}

}  // namespace

std::string outcome_name(JobOutcome o) {
  switch (o) {
    case JobOutcome::completed:
      return "completed";
    case JobOutcome::out_of_memory:
      return "out of memory";
    case JobOutcome::failed:
      return "failed";
  }
  return "?";
}

Tolerance tolerance_for(const std::string& precision) {
  // tests/e2e/test_zero_equivalence.sh and test_mixed_precision.sh pin these.
  if (precision == "fp32") return {1e-6, 2e-6};
  return {2e-4, 4e-3};
}

JobSummary summarize(const ComparedJob& job) {
  JobSummary s;
  // The first step pays for warm-up; left out when there are others.
  const std::size_t from = job.steps.size() > 1 ? 1 : 0;
  std::vector<double> t, tok, flops, bytes, wait;
  for (std::size_t i = from; i < job.steps.size(); ++i) {
    const ComparedStep& x = job.steps[i];
    t.push_back(x.step_time_s);
    tok.push_back(x.tokens_per_s);
    flops.push_back(x.flops_per_s);
    bytes.push_back(static_cast<double>(x.bytes_sent));
    wait.push_back(x.comm_wait_s);
  }
  if (t.empty()) return s;
  s.step_median = median_of(t);
  s.step_min = *std::min_element(t.begin(), t.end());
  s.step_max = *std::max_element(t.begin(), t.end());
  s.tokens_per_s = median_of(tok);
  s.flops_per_s = median_of(flops);
  s.bytes_per_step = median_of(bytes);
  s.comm_wait_per_step = median_of(wait);
  return s;
}

Verdict equivalence(const std::vector<ComparedJob>& jobs, const Tolerance& tol) {
  Verdict v;
  const ComparedJob* ref = nullptr;
  for (const auto& j : jobs)
    if (j.outcome == JobOutcome::completed && (!ref || j.strategy == "ddp")) ref = &j;
  if (!ref) {
    v.equivalent = false;
    v.message = "no strategy completed; nothing to compare";
    return v;
  }
  v.reference = ref->strategy;
  std::vector<std::string> agree;
  for (const auto& j : jobs) {
    if (&j == ref || j.outcome != JobOutcome::completed) continue;
    const std::string why = first_difference(j, *ref, tol);
    if (why.empty()) {
      agree.push_back(j.strategy);
      continue;
    }
    v.message += (v.equivalent ? "" : "; ") + why;
    v.equivalent = false;
  }
  if (!v.equivalent) return v;
  v.message = agree.empty() ? "only " + ref->strategy + " completed; nothing to compare it with"
                            : "equivalent: ";
  for (std::size_t i = 0; i < agree.size(); ++i) v.message += (i ? ", " : "") + agree[i];
  if (!agree.empty())
    v.message += std::string(agree.size() == 1 ? " reproduces " : " reproduce ") + ref->strategy +
                 "'s losses within " + general(tol.loss) + " and gradient norms within " +
                 general(tol.grad_norm) + " at every step";
  return v;
}

bool read_job_metrics(const std::filesystem::path& metrics, ComparedJob& job) {
  std::string text = read_whole_file(metrics);
  bool torn = false;
  if (!text.empty() && text.back() != '\n') {
    const std::size_t start = text.rfind('\n') + 1;  // npos + 1 = 0: the only line
    if (json::parse(text.substr(start), nullptr, false).is_discarded()) {
      text.resize(start);
      torn = true;
    }
  }
  std::istringstream lines(text);
  std::size_t line_no = 0;
  for (std::string line; std::getline(lines, line);) {
    ++line_no;
    try {
      const json j = json::parse(line);
      const std::string split = j.at("split").get<std::string>();
      if (split == "val") {
        job.val_loss = j.at("loss").get<double>();
        job.val_curve.emplace_back(j.at("step").get<std::int64_t>(), *job.val_loss);
      }
      if (split != "train") continue;
      ComparedStep s;
      s.step = j.at("step").get<std::int64_t>();
      s.loss = j.at("loss").get<double>();
      s.grad_norm = j.at("grad_norm").get<double>();
      s.step_time_s = j.at("step_time_s").get<double>();
      s.tokens_per_s = j.at("tokens_per_s").get<double>();
      s.flops_per_s = j.at("flops_per_s").get<double>();
      s.comm_wait_s = j.at("comm_wait_s").get<double>();
      s.bytes_sent = j.at("bytes_sent").get<std::uint64_t>();
      s.lr = j.value("lr", 0.0);
      s.device_peak = j.at("peak_bytes").at("device").at("total").get<std::uint64_t>();
      job.steps.push_back(s);
      job.skipped_steps = j.at("skipped_steps").get<std::int64_t>();
      const json& peak = j.at("peak_bytes");
      for (Tier t : kTiers) {
        const json& tier = peak.at(std::string(tier_name(t)));
        for (Category c : kCategories)
          job.peak[t][c] = tier.at(std::string(category_name(c))).get<std::uint64_t>();
        job.tier_peak[t] = tier.at("total").get<std::uint64_t>();
      }
    } catch (const json::exception& e) {
      throw DataError(metrics.string() + ":" + std::to_string(line_no) +
                      ": not a metrics record of ztrain's (" + e.what() +
                      "); the file was changed or damaged after the run wrote it");
    }
  }
  return torn;
}

std::optional<OomRecord> parse_oom(const std::string& error) {
  // core/device.cpp's budget refusal: "out of memory on tier 'device' (...):
  // allocating ... for activations with ... (...; in bytes: asked A, in use
  // U, budget B)".
  static const std::regex form(
      "out of memory on tier '(\\w+)'.*? for (\\w+) with .*in bytes: asked (\\d+), in use "
      "(\\d+), budget (\\d+)");
  std::smatch m;
  if (!std::regex_search(error, m, form)) return std::nullopt;
  return OomRecord{m[1].str(), m[2].str(), std::stoull(m[3].str()), std::stoull(m[4].str()),
                   std::stoull(m[5].str())};
}

std::string comparison_table(const Comparison& c) {
  std::string s;
  char line[320];
  std::snprintf(line, sizeof line, "%-16s %-13s %9s %17s %9s %9s %10s %10s %9s %9s %5s  %s\n",
                "strategy", "outcome", "step (s)", "min-max (s)", "tok/s", "FLOP/s", "comm/step",
                "wait/step", "loss", "val loss", "skip", "peak per rank by tier");
  s += line;
  for (const ComparedJob& j : c.jobs) {
    const JobSummary f = summarize(j);
    std::string peaks;
    for (Tier t : kTiers)
      if (j.tier_peak[t])
        peaks += (peaks.empty() ? "" : ", ") + std::string(tier_name(t)) + " " +
                 format_bytes(j.tier_peak[t]);
    if (j.steps.empty()) {
      std::snprintf(line, sizeof line, "%-16s %-13s ", j.strategy.c_str(),
                    outcome_name(j.outcome).c_str());
      s += line + j.error + "\n";
      continue;
    } else {
      std::snprintf(
          line, sizeof line, "%-16s %-13s %9.4f %17s %9s %9s %10s %9.4fs %9.5f %9s %5lld  %s\n",
          j.strategy.c_str(), outcome_name(j.outcome).c_str(), f.step_median,
          (fixed(f.step_min, 4) + "-" + fixed(f.step_max, 4)).c_str(),
          format_rate(f.tokens_per_s).c_str(), format_rate(f.flops_per_s).c_str(),
          format_bytes(static_cast<std::uint64_t>(f.bytes_per_step)).c_str(), f.comm_wait_per_step,
          j.steps.back().loss, j.val_loss ? fixed(*j.val_loss, 5).c_str() : "-",
          static_cast<long long>(j.skipped_steps), peaks.c_str());
    }
    s += line;
    if (!j.steps.empty() && j.outcome != JobOutcome::completed)
      s += "                 " + j.error + "\n";
  }
  s += std::string(c.verdict.equivalent ? "verdict: " : "verdict: FAILED: ") + c.verdict.message +
       "\n";
  return s;
}

std::string comparison_csv(const Comparison& c) {
  std::string s =
      "strategy,outcome,step_time_median_s,step_time_min_s,step_time_max_s,tokens_per_s,"
      "flops_per_s,bytes_per_step,comm_wait_per_step_s,final_train_loss,final_val_loss,"
      "skipped_steps";
  for (Tier t : kTiers) {
    const std::string tier(tier_name(t));
    for (Category c2 : kCategories) s += ",peak_" + tier + "_" + std::string(category_name(c2));
    s += ",peak_" + tier + "_total";
  }
  s += ",error\n";
  for (const ComparedJob& j : c.jobs) {
    const JobSummary f = summarize(j);
    const bool any = !j.steps.empty();
    s += j.strategy + "," + outcome_name(j.outcome);
    for (double v : {f.step_median, f.step_min, f.step_max, f.tokens_per_s, f.flops_per_s,
                     f.bytes_per_step, f.comm_wait_per_step})
      s += "," + (any ? general(v) : std::string());
    s += "," + (any ? general(j.steps.back().loss) : std::string());
    s += "," + (j.val_loss ? general(*j.val_loss) : std::string());
    s += "," + std::to_string(j.skipped_steps);
    for (Tier t : kTiers) {
      for (std::uint64_t b : j.peak[t]) s += "," + std::to_string(b);
      s += "," + std::to_string(j.tier_peak[t]);
    }
    std::string error = j.error;
    std::replace(error.begin(), error.end(), '"', '\'');
    s += ",\"" + error + "\"\n";
  }
  return s;
}

std::string comparison_json(const Comparison& c) {
  json out;
  out["run_file"] = c.run_file;
  out["precision"] = c.precision;
  out["ranks"] = c.ranks;
  if (!c.mesh.empty()) out["mesh"] = c.mesh;
  out["steps"] = c.steps;
  out["tolerance"] = {{"loss", c.tolerance.loss}, {"grad_norm", c.tolerance.grad_norm}};
  out["verdict"] = {{"equivalent", c.verdict.equivalent},
                    {"reference", c.verdict.reference},
                    {"message", c.verdict.message}};
  out["strategies"] = json::array();
  for (const ComparedJob& j : c.jobs) {
    const JobSummary f = summarize(j);
    json r = {{"strategy", j.strategy},
              {"outcome", outcome_name(j.outcome)},
              {"error", j.error},
              {"step_time_median_s", f.step_median},
              {"step_time_min_s", f.step_min},
              {"step_time_max_s", f.step_max},
              {"tokens_per_s", f.tokens_per_s},
              {"flops_per_s", f.flops_per_s},
              {"bytes_per_step", f.bytes_per_step},
              {"comm_wait_per_step_s", f.comm_wait_per_step},
              {"skipped_steps", j.skipped_steps}};
    r["final_train_loss"] = j.steps.empty() ? json() : json(j.steps.back().loss);
    r["final_val_loss"] = j.val_loss ? json(*j.val_loss) : json();
    json peak;
    for (Tier t : kTiers) {
      json tier;
      for (Category k : kCategories) tier[std::string(category_name(k))] = j.peak[t][k];
      tier["total"] = j.tier_peak[t];
      peak[std::string(tier_name(t))] = tier;
    }
    r["peak_bytes"] = peak;
    if (j.oom)
      r["out_of_memory"] = {{"tier", j.oom->tier},
                            {"category", j.oom->category},
                            {"requested_bytes", j.oom->requested},
                            {"in_use_bytes", j.oom->in_use},
                            {"budget_bytes", j.oom->budget}};
    json steps = json::array();
    for (const ComparedStep& x : j.steps)
      steps.push_back({{"step", x.step},
                       {"loss", x.loss},
                       {"grad_norm", x.grad_norm},
                       {"step_time_s", x.step_time_s},
                       {"bytes_sent", x.bytes_sent},
                       {"comm_wait_s", x.comm_wait_s}});
    r["steps"] = steps;
    out["strategies"].push_back(r);
  }
  return out.dump(2) + "\n";
}

}  // namespace ztrain
