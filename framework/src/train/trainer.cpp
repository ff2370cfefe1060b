#include "train/trainer.h"

#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>

#include "checkpoint/weights.h"
#include "io/durable_file.h"
#include "job/job_figures.h"
#include "job/job_start.h"
#include "job/run_outputs.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/block_gemm.h"
#include "train/failure_points.h"
#include "train/generation.h"
#include "train/run_report.h"
#include "train/step_agreement.h"
#include "ztrain/error.h"
#include "ztrain/random.h"
#include "ztrain/units.h"

namespace ztrain {
namespace fs = std::filesystem;
namespace {

double seconds_since(Trainer::Clock::time_point t0) {
  return std::chrono::duration<double>(Trainer::Clock::now() - t0).count();
}

// Makes the run directory with its config.toml; the metrics file in it. A
// resumed run keeps the directory's config.toml (the checkpoint's manifest
// has the configuration each part ran with) and appends to its metrics,
// after the lines of the steps up to its checkpoint.
MetricsFile open_run_dir(const fs::path& out_dir, const std::string& resolved_config,
                         const std::optional<Resumed>& resumed, Progress& progress) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec)
    throw Error("cannot create run directory '" + out_dir.string() + "': " + ec.message() +
                "; set [train] out_dir to a writable path");
  if (!resumed || !fs::exists(out_dir / "config.toml"))
    write_file_atomically(out_dir / "config.toml", resolved_config);
  if (!resumed) return MetricsFile(out_dir / "metrics.jsonl");
  std::size_t dropped = 0;
  MetricsFile metrics(out_dir / "metrics.jsonl", resumed->position.step, dropped);
  if (dropped)
    progress.line("metrics.jsonl: dropped " + std::to_string(dropped) + " line" +
                  (dropped > 1 ? "s" : "") + " after step " +
                  std::to_string(resumed->position.step) +
                  " (the attempt that went on past the checkpoint), which this run logs again");
  return metrics;
}

// What a resumed run says before its first step.
std::string resume_text(const Resumed& r, std::int64_t steps) {
  const std::string relayed = r.from_rank_0 ? ", which sent each other rank the ranges it holds: " +
                                                  format_bytes(r.bytes_moved) + " moved"
                                            : "";
  char read[192];
  std::snprintf(read, sizeof read, " (%s of state read by rank 0 in %.3f s%s; resumed in %.3f s)",
                format_bytes(r.bytes_read).c_str(), r.read_seconds, relayed.c_str(), r.seconds);
  std::string s = "resuming " + r.dir.string() + " at step " + std::to_string(r.position.step) +
                  " of " + std::to_string(steps) + read;
  for (const auto& c : r.changes) s += "\n  changed: " + c;
  return s;
}

// What the run will write, checked on every rank before training (rank 0
// holds out_dir's lock).
void check_outputs(const Run& run, std::int64_t n_params, bool overwrite,
                   std::unique_ptr<OutDirLock>& lock) {
  const auto& tr = run.settings.train;
  // fp32 master, m and v per parameter, for each checkpoint out_dir holds
  // at once: the run writes one every checkpoint_every steps and at its
  // end, and keeps keep_last of them beside the one being written. A run
  // without checkpoint_every writes one only when stopped by a signal,
  // which is not reserved (that write reports a full disk itself).
  const std::uint64_t written =
      tr.checkpoint_every > 0
          ? static_cast<std::uint64_t>(tr.steps / tr.checkpoint_every +
                                       (tr.steps % tr.checkpoint_every != 0 ? 1 : 0))
          : 0;
  const std::uint64_t held =
      tr.keep_last > 0 ? std::min(written, static_cast<std::uint64_t>(tr.keep_last) + 1) : written;
  std::uint64_t checkpoint_bytes = 0;
  if (__builtin_mul_overflow(12 * static_cast<std::uint64_t>(n_params), held, &checkpoint_bytes))
    checkpoint_bytes = UINT64_MAX;  // more than any disk: refused, naming the bytes
  check_run_outputs({tr.out_dir, tr.save_final, tr.export_to, tr.export_dtype, n_params, overwrite,
                     checkpoint_bytes, run.resumed.has_value(), tr.tensorboard_dir},
                    lock, *run.comm);
}

// A logged training step.
struct StepLog {
  std::int64_t done, steps;
  double loss, lr;
  StepResult result;
  double scale;
  std::int64_t skipped_steps;
  double step_time_s, tokens_per_s, flops_per_token, comm_wait_s;
  JobFigures job;
  // The step's trained tokens a second (every rank), where the data masks
  // targets.
  std::optional<double> trained_per_s;
  // Pipeline parallelism: each stage's share of the schedule it idled.
  std::vector<double> pipeline_idle = {};
};

// The step's scalars in TensorBoard: what the metrics line says, by tag.
void tensorboard_step(const StepLog& s, TensorBoardFile& tb) {
  std::vector<std::pair<std::string, double>> v = {
      {"train/loss", s.loss},
      {"train/lr", s.lr},
      {"train/grad_norm", s.result.grad_norm},
      {"train/loss_scale", s.scale},
      {"train/tokens_per_s", s.tokens_per_s},
      {"train/step_time_s", s.step_time_s},
      {"comm/bytes_sent", static_cast<double>(s.job.bytes_per_rank())},
      {"comm/wait_s", s.comm_wait_s}};
  for (Tier t : kTiers)
    v.emplace_back("memory/" + std::string(tier_name(t)) + "_peak_bytes",
                   static_cast<double>(s.job.memory.tier_peak[t]));
  tb.scalars(s.done, v);
}

// Its metrics line and TensorBoard scalars (rank 0's files, when given)
// and, when `print`, its console line (on a terminal, above the bar).
void log_step(const StepLog& s, MetricsFile* metrics, TensorBoardFile* tb, Progress& progress,
              bool print) {
  JsonLine line;
  line.add("step", s.done)
      .add("split", "train")
      .add("loss", s.loss)
      .add("lr", s.lr)
      .add("grad_norm", s.result.grad_norm)
      .add("loss_scale", s.scale)
      .add("skipped", s.result.skipped)
      .add("skipped_steps", s.skipped_steps)
      .add("step_time_s", s.step_time_s)
      .add("tokens_per_s", s.tokens_per_s)
      .add("flops_per_s", s.tokens_per_s * s.flops_per_token);
  if (s.trained_per_s) line.add("trained_tokens_per_s", *s.trained_per_s);
  line.add("bytes_sent", static_cast<std::int64_t>(s.job.bytes_per_rank()))
      .add_comm("comm", s.job.comm)
      .add("comm_wait_s", s.comm_wait_s)
      .add_memory("peak_bytes", s.job.memory, true);
  if (!s.pipeline_idle.empty()) line.add("pipeline_idle", s.pipeline_idle);
  if (metrics) metrics->write(line);
  if (tb) tensorboard_step(s, *tb);
  if (!print) return;
  char buf[192];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s",
                static_cast<long long>(s.done), static_cast<long long>(s.steps), s.loss, s.lr,
                s.result.grad_norm, format_rate(s.tokens_per_s).c_str());
  progress.line(
      buf + (s.trained_per_s ? " (" + format_rate(*s.trained_per_s) + " trained)" : std::string()));
}

// The line saying that a run reads its data more than once, and how many
// times; empty when it does not, or the source is endless.
std::string epochs_note(const DataInfo& d, const TrainSettings& tr) {
  if (!d.train_sequences || *d.train_sequences == 0) return {};
  const double epochs = static_cast<double>(tr.steps) * static_cast<double>(tr.global_batch) /
                        static_cast<double>(*d.train_sequences);
  if (epochs <= 1.0) return {};
  char line[200];
  std::snprintf(line, sizeof line,
                "data: %llu training sequences; %lld steps of %lld read them %.3g times (epochs): "
                "the data repeats",
                static_cast<unsigned long long>(*d.train_sequences),
                static_cast<long long>(tr.steps), static_cast<long long>(tr.global_batch), epochs);
  return line;
}

// A warning when an evaluation reads more sequences than the val split
// holds (it wraps and reads some twice); empty otherwise.
std::string val_wrap_note(const DataInfo& d, const TrainSettings& tr) {
  if (tr.eval_every <= 0 || !d.val_sequences || *d.val_sequences == 0) return {};
  const auto held = *d.val_sequences;
  const auto reads = static_cast<std::uint64_t>(tr.eval_batches * tr.global_batch);
  if (reads <= held) return {};
  const std::uint64_t fit = held / static_cast<std::uint64_t>(tr.global_batch);
  return "warning: data: the val split holds " +
         counted(static_cast<std::int64_t>(held), "sequence") +
         " and an evaluation reads eval_batches " + std::to_string(tr.eval_batches) + " x " +
         std::to_string(tr.global_batch) + " = " + std::to_string(reads) +
         ", so it reads some more than once; " +
         (fit > 0 ? "set [train] eval_batches = " + std::to_string(fit) + " to read each once"
                  : "hold out more (or a shorter seq_len) to read each once");
}

// How the mesh splits sequences, in words, with its groups: Ulysses',
// the ring's, or Ulysses' inside the ring's.
std::string split_groups(const Run& run) {
  const MeshPlan& m = run.mesh;
  const bool ulysses = m.size(MeshDim::sequence) > 1, ring = m.size(MeshDim::context) > 1;
  if (ulysses && ring)
    return " (Ulysses inside ring attention: heads traded across sequence groups " +
           m.describe_groups(MeshDim::sequence) +
           ", keys and values passed around context groups " + m.describe_groups(MeshDim::context) +
           ")";
  if (ring)
    return " (ring attention: keys and values passed around them, each rank holding a chunk "
           "from each end), context groups " +
           m.describe_groups(MeshDim::context);
  return " (Ulysses: attention heads traded across them), sequence groups " +
         m.describe_groups(MeshDim::sequence);
}

// The virtual stages' modules, first to last: "embed-block.5 |
// block.6-head".
std::string stage_cut(const Run& run) {
  const ModuleSpecs modules = run.model->modules();
  const std::vector<std::size_t>& b = run.pipeline_bounds;
  std::string out;
  for (std::size_t v = 0; v + 1 < b.size(); ++v) {
    const std::string& first = modules[id_at<ModuleId>(b[v])].name;
    const std::string& last = modules[id_at<ModuleId>(b[v + 1] - 1)].name;
    out += (v ? " | " : "") + first + (b[v + 1] - b[v] > 1 ? "-" + last : std::string());
  }
  return out;
}

// How the mesh splits the model and the sequences, and whom the strategy
// spans; empty for data parallelism alone.
std::string mesh_text(const Run& run) {
  const MeshPlan& m = run.mesh;
  const SequenceSplit split = run.settings.parallel.split();
  const int tensor = m.size(MeshDim::tensor), world = run.comm->size();
  std::string text;
  if (tensor > 1)
    text = "each block's projections split over tensor groups " +
           m.describe_groups(MeshDim::tensor) +
           " (Megatron's: q, k, v and the MLP's first layer by output, the attention's and the "
           "MLP's last by input, the embedding and the head by vocabulary" +
           (run.settings.parallel.tensor_sequence
                ? std::string("; the tokens between them too (tensor_sequence)")
                : std::string()) +
           "); ";
  if (split.shards() > 1)
    text += "each sequence split over " + std::to_string(split.shards()) + " ranks" +
            split_groups(run) + "; ";
  const ParallelSettings& par = run.settings.parallel;
  const int stages = m.size(MeshDim::pipeline);
  if (stages > 1)
    text +=
        "the modules cut into " + std::to_string(stages) + " stages (" + par.pipeline_partition +
        ": " + stage_cut(run) + "; " + par.pipeline_schedule + " over " +
        std::to_string(run.settings.train.grad_accum) + " micro-batches" +
        (par.pipeline_chunks > 1 ? ", " + std::to_string(par.pipeline_chunks) + " chunks a stage"
                                 : std::string()) +
        "), pipeline groups " + m.describe_groups(MeshDim::pipeline) + "; ";
  if (text.empty()) return {};
  const int parts = tensor * stages;
  if (parts == 1)
    return m.describe() + ": " + text + "[strategy] across all " + std::to_string(world) + " ranks";
  if (split.shards() > 1)
    return m.describe() + ": " + text + "[strategy] across the " + std::to_string(world / parts) +
           " ranks holding each part";
  return m.describe() + ": " + text +
         (m.size(MeshDim::data) > 1
              ? "[strategy] across data groups " + m.describe_groups(MeshDim::data)
              : std::string("[strategy] on each rank's parts alone (one data rank)"));
}

// The run's opening lines, from its parts.
RunHeader header_of(const Run& run, const ModelInfo& info, const DataInfo& dinfo) {
  const auto& tr = run.settings.train;
  RunHeader h;
  h.model_plugin = run.model_plugin;
  h.arch = info.arch;
  h.n_params = info.n_params;
  h.data_description = dinfo.description;
  h.strategy_plugin = run.strategy_plugin;
  // A cpu device's GEMMs: which kernels ran is part of what a timing means.
  h.device_name = run.device->name();
  if (run.device->kind() == DeviceKind::cpu) h.device_name += ", " + blas::report().brief();
  h.micro_batch = tr.micro_batch;
  h.grad_accum = tr.grad_accum;
  h.global_batch = tr.global_batch;
  h.ranks = run.comm->size();
  h.data_ranks = run.mesh.size(MeshDim::data);
  h.mesh = mesh_text(run);
  h.comm_backend = run.strategy_comm().backend();
  h.placement = run.placement;
  h.cores = run.cores;
  h.seq_len = info.seq_len;
  h.entropy_rate = dinfo.entropy_rate;
  h.precision = tr.precision;
  h.grad_dtype = tr.grad_dtype;
  h.activation_dtype = tr.activation_dtype;
  h.loss_scale = tr.scaler.loss_scale;
  h.initial_scale_power = static_cast<int>(tr.scaler.initial_scale_power);
  h.init_from = run.init_from;
  const WeightsImport& w = run.weights_import;
  char note[160];
  if (w.from_rank_0) {
    std::snprintf(note, sizeof note,
                  "read by rank 0, which sent each other rank the ranges it holds: %s moved in "
                  "%.3f s",
                  format_bytes(w.bytes_moved).c_str(), w.seconds);
    h.init_note = note;
  } else if (!run.init_from.empty() && run.comm->size() > 1) {
    std::snprintf(
        note, sizeof note, "each rank read the ranges it holds: %s of %s on rank 0, in %.3f s",
        format_bytes(w.bytes_read).c_str(), format_bytes(w.file_bytes).c_str(), w.seconds);
    h.init_note = note;
  }
  h.strategy_summary = run.strategy->summary();
  return h;
}

// This rank's share of the data: its data-parallel rank's rows, and its
// tokens of each under sequence and context parallelism.
DataShare data_share(const Run& run) {
  const int r = run.comm->rank();
  return {run.mesh.coordinate(r, MeshDim::data),
          run.mesh.size(MeshDim::data),
          run.settings.parallel.split(),
          {run.mesh.coordinate(r, MeshDim::sequence), run.mesh.coordinate(r, MeshDim::context)}};
}

// The summary's figures, from the loop's.
RunReport report_of(const Run& run, const TrainResult& result, const ModelInfo& info,
                    const DataInfo& dinfo, const LossScaler& scaler, std::int64_t steps,
                    std::int64_t skipped, double comm_wait, const CommCounters& train_comm,
                    Trainer::Clock::time_point t_start) {
  const auto& tr = run.settings.train;
  const JobFigures job = gather_job_figures(*run.comm, run.device->stats(), train_comm);
  RunReport report;
  report.steps = steps;
  report.wall_s = seconds_since(t_start);
  report.tokens_per_s = result.tokens_per_s;
  report.trained_per_s = result.trained_per_s;
  report.flops_per_token = info.train_flops_per_token;
  report.train_losses = result.train_losses;
  report.val_losses = result.val_losses;
  report.entropy_rate = dinfo.entropy_rate;
  report.skipped_steps = skipped;
  report.dynamic_scale = scaler.dynamic();
  report.final_loss_scale = scaler.scale();
  report.ranks = run.comm->size();
  report.bytes_per_rank = job.bytes_per_rank();
  report.comm_wait_s = comm_wait;
  report.memory = job.memory;
  report.device_budget = run.settings.device.memory_limit;
  report.estimate = run.strategy->estimate(run.sizes);
  report.metrics_file = result.metrics_file;
  if (tr.save_final) report.weights_file = tr.out_dir / "model.safetensors";
  return report;
}

}  // namespace

Trainer::Trainer(Run& run, const FaultPlan& faults, Clock::time_point t_start)
    : run_(run),
      tr_(run.settings.train),
      faults_(faults),
      t_start_(t_start),
      info_(run.model->info()),
      data_info_(run.data->info()),
      params_(run.model->params()),
      progress_(tr_.steps, run.comm->rank() == 0),
      // Rank 0 speaks for the job: progress, the run directory, the summary.
      metrics_(run.comm->rank() == 0 ? std::optional<MetricsFile>(open_run_dir(
                                           tr_.out_dir, run.resolved.toml, run.resumed, progress_))
                                     : std::nullopt),
      arena_(*run.device),
      losses_(*run.device, *run.kernels),
      data_(*run.data, static_cast<int>(tr_.micro_batch), info_.seq_len,
            static_cast<int>(tr_.grad_accum), data_share(run)),
      scaler_(tr_.scaler),
      mark_(run.counters()),
      checkpoints_(run, faults.checkpoint_kill, metrics_ ? &*metrics_ : nullptr, progress_) {
  result_.metrics_file = tr_.out_dir / "metrics.jsonl";
  if (metrics_ && !tr_.tensorboard_dir.empty()) tensorboard_.emplace(tr_.tensorboard_dir);
  progress_.line(run_header(header_of(run_, info_, data_info_)));
  for (const auto& note : run_.config_notes) progress_.line(note);
  if (const std::string epochs = epochs_note(data_info_, tr_); !epochs.empty())
    progress_.line(epochs);
  if (const std::string wrap = val_wrap_note(data_info_, tr_); !wrap.empty()) progress_.line(wrap);
  if (run_.resumed) resume();
  if (tr_.sample.every > 0 && run_.comm->rank() == 0) open_sampling();
  if (!run_.pipeline_bounds.empty())
    pipeline_ = std::make_unique<PipelineStep>(pipeline_setup(run_, params_));
  first_step_ = at_.step;
}

double Trainer::loss_weight() const {
  return pipeline_ ? pipeline_->loss_weight() : 1.0;
}

void Trainer::open_sampling() {
  const std::filesystem::path file = data_info_.tokenizer;
  sample_tokenizer_ = text::load_tokenizer(file);
  sample_stop_ = data_info_.document_start;
  if (!sample_stop_)
    if (const auto start = text::document_start(*sample_tokenizer_, file))
      sample_stop_ = sample_tokenizer_->token_id(*start);
  if (sample_stop_) sample_prompt_.push_back(*sample_stop_);
  for (const std::int32_t id : sample_tokenizer_->encode(tr_.sample.prompt))
    sample_prompt_.push_back(id);
}

void Trainer::sample(std::int64_t step) {
  const SampleSettings& s = tr_.sample;
  const GenerationSettings settings{s.tokens, s.temperature, s.top_k,
                                    hash_combine(tr_.seed, static_cast<std::uint64_t>(step)),
                                    sample_stop_};
  const std::vector<std::int32_t> made = generate(run_, arena_, losses_, sample_prompt_, settings);
  if (!sample_tokenizer_) return;
  const std::string text = s.prompt + sample_tokenizer_->decode(made);
  if (metrics_)
    metrics_->write(JsonLine().add("step", step).add("split", "sample").add("text", text));
  progress_.line("sample step " + std::to_string(step) + " | " + text);
}

// A resumed run's position: the scaler and the data continue from it.
void Trainer::resume() {
  at_ = run_.resumed->position;
  scaler_.restore(at_.scaler);
  data_.seek(static_cast<std::uint64_t>(at_.step * tr_.grad_accum));
  progress_.line(resume_text(*run_.resumed, tr_.steps));
  if (metrics_)
    metrics_->write(JsonLine()
                        .add("step", at_.step)
                        .add("split", "resume")
                        .add("from", run_.resumed->dir.string())
                        .add("bytes_read", static_cast<std::int64_t>(run_.resumed->bytes_read))
                        .add("bytes_moved", static_cast<std::int64_t>(run_.resumed->bytes_moved))
                        .add("seconds", run_.resumed->seconds)
                        .add("read_s", run_.resumed->read_seconds));
  mark_ = run_.counters();
}

TrainResult Trainer::train() {
  // From here on the first SIGINT/SIGTERM finishes the step, writes a
  // checkpoint and ends the run with exit 0; every rank stops at the same
  // step.
  const StopRequests stop_requests;
  for (std::int64_t step = at_.step; step < tr_.steps && !stopped_; ++step) train_step(step);
  progress_.finish();
  finish();
  summarize();
  return result_;
}

void Trainer::train_step(std::int64_t step) {
  const auto t0 = Clock::now();
  // A skipped step consumes its batch but neither the optimizer's step
  // count nor the learning-rate schedule (DeepSpeed's engine does the same).
  if (run_.failure_points) run_.failure_points->set_step(step + 1);
  const double lr = lr_at(tr_.schedule, at_.applied) * faults_.lr_factor(step + 1);
  const double scale = scaler_.scale();
  const std::uint64_t trained = step_tokens(step);
  micro_steps(step, scale, trained);
  // The losses are read once the step is queued: on a GPU nothing between
  // the first forward and the update waits for the host. A non-finite loss
  // has non-finite gradients, which step() skips.
  const StepResult sr =
      run_.strategy->step({lr, at_.applied + 1, tr_.grad_clip, scale,
                           run_.group_of(MeshDim::tensor), run_.group_of(MeshDim::pipeline)});
  const StepAgreement agreed = StepAgreement::reach(
      *run_.comm, {static_cast<float>(losses_.take() / static_cast<double>(tr_.grad_accum) *
                                      trained_factor(tr_.grad_accum, trained) * loss_weight()),
                   StopRequests::requested() != 0, checkpoints_.rank_done()});
  stopped_ = agreed.stop;
  if (stopped_) stop_agreed();
  count_step(sr, agreed.loss, lr, scale, step);
  const std::int64_t done = step + 1;
  record_step(sr, agreed.loss, lr, scale, done, trained, t0);
  if (tr_.eval_every > 0 && (done % tr_.eval_every == 0 || done == tr_.steps)) evaluate(done);
  if (tr_.sample.every > 0 && done % tr_.sample.every == 0) sample(done);
  at_.step = done;
  at_.scaler = scaler_.state();
  checkpoint_after(done, agreed.written_everywhere);
  mark_ = run_.counters();
}

Batch Trainer::with_activations(Batch batch) const {
  batch.shape.activations = tr_.activation_dtype;
  return batch;
}

std::uint64_t Trainer::step_tokens(std::int64_t step) {
  const std::uint64_t mine = data_.step_targets();
  const std::uint64_t trained = on_every_rank(mine);
  if (trained == 0)
    throw DataError("step " + std::to_string(step + 1) +
                    ": every target of the global batch is masked (-100), so there is nothing to "
                    "train on; check the data's masks (prompts as long as the sequence?)");
  return trained;
}

// Without masks every rank holds as many tokens: no collective.
std::uint64_t Trainer::on_every_rank(std::uint64_t mine) {
  if (!data_.masks()) return mine * static_cast<std::uint64_t>(run_.comm->size());
  return total_over_ranks(*run_.comm, mine);
}

double Trainer::trained_factor(std::int64_t micro, std::uint64_t trained) const {
  return static_cast<double>(micro) * static_cast<double>(data_.micro_tokens()) *
         static_cast<double>(run_.comm->size()) / static_cast<double>(trained);
}

StageContextParts Trainer::stage_parts() {
  return {*run_.strategy,
          params_,
          *run_.kernels,
          arena_,
          losses_,
          run_.group_of(MeshDim::sequence),
          run_.group_of(MeshDim::context),
          run_.group_of(MeshDim::tensor)};
}

// The step's micro-batches held for the schedule, which reads each twice
// (forward, then backward) and in its own order.
void Trainer::pipeline_step(std::int64_t step, float token_scale) {
  if (faults_.overflows(step + 1, run_.comm->rank()))
    token_scale = std::numeric_limits<float>::quiet_NaN();
  std::vector<HeldBatch> held;
  for (std::int64_t a = 0; a < tr_.grad_accum; ++a)
    held.emplace_back(with_activations(data_.next()));
  std::vector<Batch> batches;
  for (const HeldBatch& h : held) batches.push_back(h.batch());
  pipeline_->train(batches, stage_parts(), token_scale);
}

void Trainer::micro_steps(std::int64_t step, double scale, std::uint64_t trained) {
  const auto step_scale = static_cast<float>(scale * static_cast<double>(run_.comm->size()) /
                                             static_cast<double>(trained));
  if (pipeline_) return pipeline_step(step, step_scale);
  for (std::int64_t a = 0; a < tr_.grad_accum; ++a) {
    const bool last = a + 1 == tr_.grad_accum;
    run_.strategy->begin_micro_step(last);
    arena_.reset();
    float token_scale = step_scale;
    if (last && faults_.overflows(step + 1, run_.comm->rank()))
      token_scale = std::numeric_limits<float>::quiet_NaN();
    StepContext ctx = stage_parts().context_for(token_scale);
    run_.model->forward_backward(with_activations(data_.next()), ctx);
  }
}

void Trainer::count_step(const StepResult& sr, double loss, double lr, double scale,
                         std::int64_t step) {
  if (!std::isfinite(loss) && !scaler_.dynamic())
    throw NumericsError("training loss is " + std::to_string(loss) + " at step " +
                        std::to_string(step + 1) + " (lr " + std::to_string(lr) +
                        "); lower [train] lr, raise warmup_steps or set grad_clip");
  const double next_scale = scaler_.update(sr.overflow);
  if (!sr.skipped) {
    ++at_.applied;
    return;
  }
  ++at_.skipped;
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "overflow: skipping step %lld (gradients not finite), loss scale %.15g -> %.15g",
                static_cast<long long>(step + 1), scale, next_scale);
  progress_.line(buf);
}

void Trainer::record_step(const StepResult& sr, double loss, double lr, double scale,
                          std::int64_t done, std::uint64_t trained, Clock::time_point t0) {
  const double dt = seconds_since(t0);
  const CommCounters step_comm = run_.counters().since(mark_);
  train_comm_ += step_comm;
  const double step_wait = run_.strategy->stats().comm_wait_s - comm_wait_s_;
  comm_wait_s_ += step_wait;
  if (done > first_step_ + 1 || tr_.steps == first_step_ + 1) {  // the first pays for warm-up
    train_time_s_ += dt;
    timed_trained_ += static_cast<double>(trained);
    ++timed_steps_;
  }
  result_.train_losses.push_back(loss);
  const double tps = static_cast<double>(tr_.global_batch) * info_.seq_len / dt;
  progress_.update(done, loss, tps, seconds_since(t_start_));
  // Every rank takes the same branch: the job's figures are gathered.
  const bool ends = done == tr_.steps || done == 1;
  const bool log = ends || done % tr_.log_every == 0;
  const bool print = ends || done % tr_.print_every == 0;
  if (log || print)
    log_step(
        {done, tr_.steps, loss, lr, sr, scale, at_.skipped, dt, tps, info_.train_flops_per_token,
         step_wait, gather_job_figures(*run_.comm, run_.device->stats(), step_comm),
         data_.masks() ? std::optional(static_cast<double>(trained) / dt) : std::nullopt,
         pipeline_ ? pipeline_->idle_shares() : std::vector<double>{}},
        log && metrics_ ? &*metrics_ : nullptr, log && tensorboard_ ? &*tensorboard_ : nullptr,
        progress_, print);
}

// eval_batches global batches of the val split: the same sequences at any
// world size and split of the global batch; each rank takes its share.
void Trainer::evaluate(std::int64_t step) {
  const std::int64_t micro_batches = tr_.eval_batches * tr_.grad_accum;
  std::uint64_t mine = 0;
  for (std::int64_t j = 0; j < micro_batches; ++j) {
    arena_.reset();
    const Batch batch = with_activations(data_.val(j));
    mine += DataLoader::trained(batch);
    if (pipeline_) {
      pipeline_->evaluate(batch, stage_parts());
      continue;
    }
    StepContext ctx = stage_parts().context_for(1.0f);
    run_.model->evaluate(batch, ctx);
  }
  const std::uint64_t trained = on_every_rank(mine);
  if (trained == 0)
    throw DataError("evaluation at step " + std::to_string(step) +
                    ": every target of the val batches is masked (-100); nothing to evaluate");
  float mean = static_cast<float>(losses_.take() / static_cast<double>(micro_batches) *
                                  trained_factor(micro_batches, trained) * loss_weight());
  run_.comm->all_reduce(&mean, 1, DType::f32, ReduceOp::average);
  const double loss = mean;
  result_.val_losses.emplace_back(step, loss);
  if (metrics_) metrics_->write(JsonLine().add("step", step).add("split", "val").add("loss", loss));
  if (tensorboard_) tensorboard_->scalars(step, {{"val/loss", loss}});
  char buf[128];
  std::snprintf(buf, sizeof buf, "eval step %lld | val loss %.4f", static_cast<long long>(step),
                loss);
  progress_.line(buf);
}

void Trainer::checkpoint_after(std::int64_t done, bool written_everywhere) {
  if (stopped_) {
    stopped_at_ = checkpoints_.stop(at_);
    return;
  }
  const bool due =
      tr_.checkpoint_every > 0 && (done % tr_.checkpoint_every == 0 || done == tr_.steps);
  checkpoints_.after_step(at_, written_everywhere, due, done == tr_.steps);
}

void Trainer::finish() {
  if (!stopped_) {
    // Every rank takes part (sharded parameters are gathered); rank 0 writes.
    const bool lead = run_.comm->rank() == 0;
    const TextFiles text{data_info_.tokenizer, data_info_.chat_template,
                         data_info_.chat_template_text};
    const ModelParts parts{run_.group_of(MeshDim::tensor), run_.group_of(MeshDim::pipeline),
                           &run_.whole_params, run_.pipeline_bounds};
    if (tr_.save_final)
      export_weights(*run_.model, *run_.strategy, tr_.out_dir, DType::f32, lead, text, parts);
    if (!tr_.export_to.empty())
      export_weights(*run_.model, *run_.strategy, tr_.export_to, tr_.export_dtype, lead, text,
                     parts);
    return;
  }
  const int sig = StopRequests::requested();
  const std::string signal = sig == SIGINT    ? "SIGINT"
                             : sig == SIGUSR1 ? "the launcher (its SIGTERM or Ctrl-C, passed on)"
                                              : "SIGTERM";
  const std::int64_t s = at_.step;
  const std::string where =
      stopped_at_ == s ? std::string("checkpoint above")
                       : "the checkpoint of step " + std::to_string(stopped_at_) +
                             ", being written when the signal came, is where it stops (" +
                             (s == stopped_at_ + 1 ? "step " + std::to_string(s) + " is"
                                                   : "steps " + std::to_string(stopped_at_ + 1) +
                                                         "-" + std::to_string(s) + " are") +
                             " trained again)";
  progress_.line("stopped at step " + std::to_string(s) + " by " + signal + "; " + where +
                 "; continue with the same command and --resume (the latest checkpoint in " +
                 tr_.out_dir.string() + "); no final weights were written");
}

void Trainer::summarize() {
  const double tokens_per_step = static_cast<double>(tr_.global_batch) * info_.seq_len;
  result_.tokens_per_s =
      timed_steps_ ? tokens_per_step * static_cast<double>(timed_steps_) / train_time_s_ : 0;
  if (data_.masks() && timed_steps_) result_.trained_per_s = timed_trained_ / train_time_s_;
  RunReport report = report_of(run_, result_, info_, data_info_, scaler_, at_.step - first_step_,
                               at_.skipped, comm_wait_s_, train_comm_, t_start_);
  if (stopped_) report.weights_file.reset();  // a stopped run writes none
  progress_.line(summary_text(report));
}

namespace {

// Which strategies keep less on the device than `plugin`, for the end of an
// out-of-memory error: never the one the run already uses.
std::string stronger_than(const std::string& plugin) {
  static const std::map<std::string, std::string> stronger = {
      {"ddp", "zero2, zero3, zero3_offload"},
      {"zero1", "zero2, zero3, zero3_offload"},
      {"zero2", "zero3, zero2_offload, zero3_offload"},
      {"zero3", "zero3_offload, zero3_nvme"},
      {"cpu_offload",
       "zero3_nvme, or cpu_offload with more offloaded (offload_param.device = \"cpu\", "
       "offload_optimizer.ratio = \"auto\")"}};
  const auto it = stronger.find(plugin);
  if (plugin == "nvme_offload")
    return " (nvme_offload already keeps the most off the device; `ztrain estimate --all` shows "
           "what each part needs)";
  return (it == stronger.end() ? std::string() : " than " + plugin + ": " + it->second) +
         " (`ztrain estimate --all` sizes each)";
}

// f(), its out-of-memory error ending with the strategies to try.
template <class F>
auto with_memory_hint(const std::string& strategy, F&& f) {
  try {
    return f();
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(std::string(e.what()) + stronger_than(strategy));
  }
}

// A test's injected failure: its points around the job's communicator
// (before the run is assembled over it); null without one.
std::shared_ptr<FailurePoints> arm_failure(const InjectedFailure& failure,
                                           std::unique_ptr<Communicator>& comm) {
  if (failure.where.empty()) return nullptr;
  auto points = std::make_shared<FailurePoints>(failure, comm->rank());
  comm = with_failure_points(std::move(comm), points);
  return points;
}

TrainResult train_run(const TrainArgs& args) {
  const auto t_start = Trainer::Clock::now();
  JobStart job = start_job([&] { return load_run_config(args); }, args.overwrite);
  const auto failure_points = arm_failure(args.faults.failure, job.comm);
  // Held until the run and everything it writes are done.
  std::unique_ptr<OutDirLock> out_dir_lock = lock_out_dir(resolve_out_dir(job.config), *job.comm);
  const PluginLoader loader = command_line_loader(args.plugin_paths, args.verbose);
  if (args.verbose) {
    std::fprintf(stderr, "[ztrain] GEMMs: %s\n", blas::report().line().c_str());
    std::fprintf(stderr, "[ztrain] attention's block products: %s\n", vec::block_gemm_name());
  }
  const std::string strategy = job.config.plugin("strategy", "ddp");
  Run run =
      with_memory_hint(strategy, [&] { return assemble(std::move(job.comm), job.config, loader); });
  if (failure_points) {
    run.strategy = with_failure_points(run.strategy, failure_points);
    run.failure_points = failure_points;
  }
  try {
    return with_memory_hint(strategy, [&] {
      check_outputs(run, run.model->info().n_params, job.overwrite, out_dir_lock);
      TrainResult result = Trainer(run, args.faults, t_start).train();
      if (failure_points) failure_points->warn_if_unreached();
      return result;
    });
  } catch (const std::exception& e) {
    // With other ranks, unwinding the run may wait for collectives they
    // will never finish: say what went wrong first, then tell them (they
    // end the job naming this rank, and this rank's own waits end two
    // seconds later, comm.h).
    if (run.comm->size() == 1) throw;
    const bool config_error = dynamic_cast<const ConfigError*>(&e) != nullptr;
    std::fprintf(stderr, "[rank %d] ztrain: %s: %s\n", run.comm->rank(),
                 config_error ? "config error" : "error", e.what());
    std::fflush(stderr);
    run.comm->announce_failure(e.what());
    throw ReportedError(e.what(), config_error ? 2 : 1);
  }
}

}  // namespace

ReportedError::~ReportedError() = default;

TrainResult train(const TrainArgs& args) {
  try {
    return train_run(args);
  } catch (const ReportedError&) {
    throw;  // made by the host, after the plugins' own exceptions were printed
  } catch (...) {
    rethrow_detached();
  }
}

}  // namespace ztrain
