#include "train/run_report.h"

#include <cstdio>
#include <sstream>

#include "config/run_settings.h"
#include "train/progress.h"
#include "ztrain/units.h"
#include "ztrain/version.h"

namespace ztrain {
namespace {

// " (category bytes, ...)" of one tier's nonzero categories; empty if none.
std::string categories(const PerCategory<std::uint64_t>& bytes) {
  std::string line;
  const char* sep = " (";
  for (Category c : kCategories) {
    if (!bytes[c]) continue;
    line += sep + std::string(category_name(c)) + " " + format_bytes(bytes[c]);
    sep = ", ";
  }
  return line.empty() ? line : line + ")";
}

}  // namespace

std::string run_header(const RunHeader& h) {
  std::ostringstream os;
  os << "ztrain " << ZTRAIN_VERSION << " | model " << h.model_plugin << " (" << h.arch << ", "
     << format_rate(static_cast<double>(h.n_params)) << " params) | data " << h.data_description
     << " | strategy " << h.strategy_plugin << " | " << h.device_name << "\n"
     << "batch: " << h.micro_batch << " x " << h.grad_accum << " accum x ";
  if (h.mesh.empty())
    os << h.ranks << (h.ranks == 1 ? " rank = " : " ranks = ");
  else
    os << h.data_ranks << (h.data_ranks == 1 ? " data rank = " : " data ranks = ");
  os << h.global_batch << " sequences of " << h.seq_len << " tokens per step";
  if (h.ranks > 1) os << " | collectives on " << h.comm_backend;
  if (h.entropy_rate) os << " | source entropy " << *h.entropy_rate << " nats/token";
  if (!h.mesh.empty()) os << "\nmesh: " << h.mesh;
  if (!h.placement.empty()) os << "\nplacement: " << h.placement;
  if (!h.cores.empty()) os << "\ncores: " << h.cores;
  os << "\nprecision: " << precision_label(h.precision) << " working weights";
  if (h.precision != DType::f32) os << ", fp32 master weights";
  os << ", gradients accumulated and reduced in " << precision_label(h.grad_dtype);
  if (h.precision != DType::f32)
    os << ", activations kept in " << precision_label(h.activation_dtype);
  os << ", loss scale ";
  if (h.precision != DType::f16)
    os << "1";
  else if (h.loss_scale > 0)
    os << h.loss_scale << " (static)";
  else
    os << "dynamic from 2^" << h.initial_scale_power;
  if (!h.init_from.empty())
    os << "\nweights from " << h.init_from.string()
       << (h.init_note.empty() ? "" : " (" + h.init_note + ")");
  if (!h.strategy_summary.empty()) os << "\n" << h.strategy_plugin << ": " << h.strategy_summary;
  return os.str();
}

std::string summary_text(const RunReport& r) {
  std::ostringstream os;
  os << "done: " << r.steps << (r.steps == 1 ? " step in " : " steps in ")
     << format_duration(r.wall_s) << " | " << format_rate(r.tokens_per_s) << " tok/s"
     << (r.trained_per_s ? " (" + format_rate(*r.trained_per_s) + " trained)" : std::string())
     << " | " << format_rate(r.tokens_per_s * r.flops_per_token) << " FLOP/s (model)\n";
  os << "final train loss " << r.train_losses.back();
  if (!r.val_losses.empty()) os << " | val loss " << r.val_losses.back().second;
  if (r.entropy_rate) {
    const double ref = r.val_losses.empty() ? r.train_losses.back() : r.val_losses.back().second;
    char buf[96];
    std::snprintf(buf, sizeof buf, " | source entropy %.4f (%.1f%% above)", *r.entropy_rate,
                  100.0 * (ref / *r.entropy_rate - 1.0));
    os << buf;
  }
  if (r.skipped_steps > 0 || r.dynamic_scale) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "\n%lld step%s skipped on gradient overflow; loss scale %.15g",
                  static_cast<long long>(r.skipped_steps), r.skipped_steps == 1 ? "" : "s",
                  r.final_loss_scale);
    os << buf;
  }
  if (r.ranks > 1) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "\ncommunication per rank: %s sent per step, %.3f s per step waiting on it",
                  format_bytes(r.bytes_per_rank / static_cast<std::uint64_t>(r.steps)).c_str(),
                  r.comm_wait_s / static_cast<double>(r.steps));
    os << buf;
  }
  // A category's peak and the tier's come at different moments (gathered
  // parameters in forward, gradients in backward): the brackets can add
  // up to more than the tier's peak, which the heading says.
  os << "\npeak memory per tier (in brackets each category's own peak; they come at different "
        "moments, so they can add up to more):";
  for (Tier t : kTiers) {
    if (!r.memory.tier_peak[t]) continue;
    os << "\n  " << tier_name(t) << ": " << format_bytes(r.memory.tier_peak[t]);
    if (t == Tier::device && r.device_budget)
      os << " of a " << format_bytes(*r.device_budget) << " budget";
    os << categories(r.memory.peak[t]);
  }
  // What `ztrain estimate` predicts for this run, beside the measurement.
  os << "\nstrategy estimate per rank:";
  for (Tier t : kTiers) {
    const std::string line = categories(r.estimate.bytes[t]);
    if (!line.empty()) os << "\n  " << tier_name(t) << line;
  }
  os << "\nmetrics: " << r.metrics_file.string();
  if (r.weights_file) os << " | weights: " << r.weights_file->string();
  return os.str();
}

}  // namespace ztrain
