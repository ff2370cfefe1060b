#include "train/trainer.h"

#include <signal.h>

#include <boost/dll/runtime_symbol_info.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "checkpoint/weights.h"
#include "checkpoint/writer.h"
#include "comm/world.h"
#include "config/deepspeed_import.h"
#include "config/resolved_config.h"
#include "config/section_options.h"
#include "core/host_name.h"
#include "core/signals.h"
#include "io/durable_file.h"
#include "job/guarded_device.h"
#include "job/job_figures.h"
#include "job/job_start.h"
#include "job/memory_check.h"
#include "job/rank_agreement.h"
#include "job/run_outputs.h"
#include "loader/cuda_loader.h"
#include "train/data_loader.h"
#include "train/loss_scaler.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/run_parts.h"
#include "train/run_report.h"
#include "ztrain/error.h"
#include "ztrain/units.h"
#include "ztrain/version.h"

namespace ztrain {
namespace fs = std::filesystem;

std::vector<fs::path> config_roots(const fs::path& run_file) {
  std::vector<fs::path> dirs;
  dirs.push_back(run_file.parent_path().empty() ? fs::path(".") : run_file.parent_path());
  std::error_code ec;
  const fs::path exe(boost::dll::program_location(ec).string());
  if (!ec) dirs.push_back(exe.parent_path().parent_path() / "share" / "ztrain" / "configs");
#ifdef ZTRAIN_SOURCE_CONFIG_DIR
  dirs.push_back(fs::path(ZTRAIN_SOURCE_CONFIG_DIR));
#endif
  return dirs;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A test hook: ZTRAIN_TEST_INJECT_OVERFLOW="STEP:RANK" makes rank RANK's
// gradients NaN in step STEP (1-based), as an fp16 overflow would.
struct OverflowInjection {
  std::int64_t step = 0;
  int rank = -1;
};

OverflowInjection overflow_injection() {
  const char* text = std::getenv("ZTRAIN_TEST_INJECT_OVERFLOW");
  if (!text || !*text) return {};
  long long step = 0;
  int rank = -1, used = 0;
  if (std::sscanf(text, "%lld:%d%n", &step, &rank, &used) != 2 || text[used] != '\0' || step < 1 ||
      rank < 0)
    throw ConfigError(std::string("ZTRAIN_TEST_INJECT_OVERFLOW=") + text +
                      ": expected STEP:RANK, e.g. 3:1");
  return {step, rank};
}

// Test hook: ZTRAIN_TEST_SCALE_LR=STEP trains step STEP with 1.1 times
// its learning rate, so that a run differs from its peers from step
// STEP + 1 on (the comparison's failure verdict is tested with it). 0: off.
std::int64_t lr_perturbation() {
  const char* text = std::getenv("ZTRAIN_TEST_SCALE_LR");
  if (!text || !*text) return 0;
  long long step = 0;
  int used = 0;
  if (std::sscanf(text, "%lld%n", &step, &used) != 1 || text[used] != '\0' || step < 1)
    throw ConfigError(std::string("ZTRAIN_TEST_SCALE_LR=") + text + ": expected a step, e.g. 5");
  return step;
}

// The data source, made and set up on every rank, its files compared
// across ranks. A rank that cannot open its files (missing on its host)
// stops every rank, saying so with its host's name.
DataInfo open_data(Run& run, const RunParts& parts) {
  std::string why;
  DataInfo info;
  try {
    run.data = parts.data_lib.create<DataSource>(parts.data_options);
    run.data->setup({parts.info.seq_len, parts.info.vocab_size, run.data_seed,
                     run.settings.train.eval_every > 0});
    info = run.data->info();
  } catch (const DataError& e) {
    why = std::string(e.what()) + " (on host " + host_name() + ", rank " +
          std::to_string(run.comm->rank()) + ")";
  }
  stop_together<DataError>(why, "another rank cannot read its data (its error is above)",
                           *run.comm);
  check_files_agree("data file", info.files, *run.comm);
  return info;
}

// The device, its kernels and, on a GPU, the nccl communicator the
// strategy's collectives run on (the launcher's carries its id and the
// trainer's own scalars). One GPU per rank: the rank's place among the
// ranks on its machine picks it.
void open_device(Run& run) {
  const DeviceSettings& dev = run.settings.device;
  // Unless set, the ranks on one machine share its cores.
  const int threads =
      dev.threads > 0
          ? dev.threads
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local_rank_count());
  if (dev.guard) {
    if (run.comm->size() != 1)
      throw ConfigError("[device] guard = true runs one rank; this run has " +
                        std::to_string(run.comm->size()));
    GuardedCpu g = make_guarded_cpu(threads);
    run.device = std::move(g.device);
    run.kernels = std::move(g.kernels);
    run.gpu_comm = g.guard_comm(make_local_communicator(), *run.device);
    run.host_kernels = make_cpu_kernels();  // unguarded: host state only
  } else if (dev.kind != "cuda") {
    run.device = make_cpu_device(threads);
    run.kernels = make_cpu_kernels();
  } else {
    const auto refuse = [&](const std::string& why) {
      return ConfigError(dev.kind_where + ": [device] kind \"cuda\": " + why +
                         "; use kind = \"cpu\" (or \"auto\")");
    };
    if (const std::string why = cuda_unusable(); !why.empty()) throw refuse(why);
    const cuda::Backend* backend = cuda_backend(nullptr);
    cuda::CudaOptions o;
    o.ordinal = local_rank();
    o.pin_memory = dev.pin_memory;
    o.host_threads = threads;
    run.device = backend->make_device(o);
    run.kernels = backend->make_kernels(*run.device, {dev.tf32, run.settings.train.precision});
    run.gpu_comm = backend->make_nccl(*run.comm, *run.device, run.settings.comm.timeout_s);
    run.host_threads = std::make_unique<HostThreads>(threads);
    run.host_kernels = make_cpu_kernels();
  }
  run.device->set_budget(Tier::device, dev.memory_limit);
}

Run assemble_run(std::unique_ptr<Communicator> comm, const RunConfig& config,
                 const PluginLoader& loader) {
  Run run;
  run.comm = std::move(comm);
  run.resolved = resolve_config(config, loader);
  run.config_notes = config.notes();
  RunParts parts = make_run_parts(config, loader, run.comm->size());
  std::vector<InstalledPart> installed = parts.plugins;
  if (parts.settings.device.kind == "cuda")
    installed.push_back({"CUDA backend", cuda_backend_path(), ZTRAIN_VERSION});
  check_installations_agree(installed, *run.comm);
  run.settings = parts.settings;
  run.model_plugin = parts.model_plugin;
  run.data_plugin = parts.data_plugin;
  run.strategy_plugin = parts.strategy_plugin;
  run.data_seed = static_cast<std::uint64_t>(parts.data_options.get_int("seed"));
  run.model = parts.model;
  run.strategy = parts.strategy;

  open_device(run);

  const ModelInfo& info = parts.info;
  const DataInfo dinfo = open_data(run, parts);
  if (dinfo.vocab_used > info.vocab_size)
    throw ConfigError(config.where("model.vocab_size") + ": [model] vocab_size " +
                      std::to_string(info.vocab_size) + " is smaller than the " +
                      std::to_string(dinfo.vocab_used) + " token ids the data produces (" +
                      dinfo.description + "); raise vocab_size");

  const auto& tr = run.settings.train;
  run.sizes = parts.sizes;
  const EstimateArgs& sizes = run.sizes;
  check_memory_fits(config, run.strategy->estimate(sizes), run.device->host_visible(Tier::device),
                    sizes.activation_bytes, static_cast<int>(tr.micro_batch), info.seq_len,
                    info.n_params, local_rank_count(), *run.comm);
  StrategySetup setup;
  setup.params = sizes.params;
  setup.modules = run.model->modules();
  setup.device = run.device.get();
  setup.comm = &run.strategy_comm();
  setup.kernels = run.kernels.get();
  setup.host_kernels = run.host_kernels ? run.host_kernels.get() : run.kernels.get();
  setup.optimizer = {tr.beta1, tr.beta2, tr.eps, tr.weight_decay};
  setup.precision = sizes.precision;
  setup.grad_dtype = sizes.grad_dtype;
  setup.seed = tr.seed;
  setup.draw_initial_values = tr.resume.empty() && !parts.model_options.has_value("init_from");
  setup.activation_bytes = sizes.activation_bytes;
  setup.device_budget = sizes.device_budget;
  run.strategy->setup(setup);
  if (!tr.resume.empty()) {
    run.resumed = resume_from(
        {tr.resume, tr.out_dir, setup.params, run.resolved.keys, tr.global_batch, tr.steps},
        *run.strategy, *run.comm);
  } else if (parts.model_options.has_value("init_from")) {
    run.init_from = parts.model_options.get_string("init_from");
    run.weights_import = import_weights(*run.model, *run.strategy, run.init_from, *run.comm);
  }
  return run;
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

// The manifest of a checkpoint at `position`, without its state.
Manifest checkpoint_header(const Run& run, const TrainingPosition& position) {
  const auto& tr = run.settings.train;
  Manifest m;
  m.ztrain_version = ZTRAIN_VERSION;
  m.world = run.comm->size();
  m.strategy = run.strategy_plugin;
  m.precision = precision_label(tr.precision);
  m.global_batch = tr.global_batch;
  m.grad_accum = tr.grad_accum;
  m.seed = tr.seed;
  m.data_seed = run.data_seed;
  m.position = position;
  m.config = run.resolved.keys;
  m.config_toml = run.resolved.toml;
  return m;
}

// Whether checkpoints are written by a background thread. "auto" asks for
// a core the training leaves free: on a GPU the host's cores mostly wait,
// while a CPU run whose threads take every core pays for the writer thread
// in slower steps, more than writing within the step costs
// (bench/RESULTS.md, checkpoints: +3.4 % against +2.3 % at world 2 with
// both cores computing, +1.1 % against +3.7 % with one left free).
bool writes_in_background(const Run& run) {
  const std::string& mode = run.settings.train.checkpoint_write;
  if (mode != "auto") return mode == "background";
  if (run.device->kind() != DeviceKind::cpu) return true;
  const unsigned cores = std::thread::hardware_concurrency();
  return cores == 0 || static_cast<unsigned>(run.device->threads() * local_rank_count()) < cores;
}

// Starts the checkpoint of `position` in `into`: the state copied (or
// written), the rest left to the background. The copy may take half the
// memory the host has left, shared by its ranks, beside the copies kept
// from the last checkpoint.
void begin_checkpoint(Run& run, const TrainingPosition& position, SnapshotBuffers& buffers,
                      CheckpointPruner& pruner, std::optional<CheckpointWrite>& into) {
  const auto& tr = run.settings.train;
  const std::uint64_t allowance =
      writes_in_background(run)
          ? available_memory() / (2 * static_cast<std::uint64_t>(local_rank_count())) +
                buffers.kept_bytes()
          : 0;
  into.emplace(CheckpointTarget{tr.out_dir, tr.keep_last, allowance},
               checkpoint_header(run, position), run.model->params(), *run.strategy, buffers,
               pruner, *run.comm);
}

// Commits a checkpoint whose files are written and says so.
// `overlapped`: training went on while it was written.
void finish_checkpoint(Run& run, CheckpointWrite& c, std::int64_t step, bool overlapped,
                       MetricsFile* metrics, Progress& progress) {
  const CheckpointWritten w = c.finish();
  overlapped = overlapped && w.background;
  if (metrics)
    metrics->write(JsonLine()
                       .add("step", step)
                       .add("split", "checkpoint")
                       .add("dir", w.dir.string())
                       .add("bytes", static_cast<std::int64_t>(w.bytes))
                       .add("seconds", w.seconds)
                       .add("held_s", w.held_s)
                       .add("copy_s", w.copy_s)
                       .add("commit_s", w.commit_s)
                       .add("overlapped", overlapped));
  if (run.comm->rank() != 0) return;
  char line[160];
  std::snprintf(line, sizeof line, " in %.3f s (%s/s); training held %.3f s%s", w.seconds,
                format_bytes(static_cast<std::uint64_t>(static_cast<double>(w.bytes) /
                                                        std::max(w.seconds, 1e-9)))
                    .c_str(),
                w.held_s, overlapped ? ", the rest written while training went on" : "");
  progress.line("checkpoint " + w.dir.string() + ": " + format_bytes(w.bytes) + line);
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
                     checkpoint_bytes, run.resumed.has_value()},
                    lock, *run.comm);
}

// A resumed run's position: the scaler and the data continue from it.
TrainingPosition continue_at(const Run& run, LossScaler& scaler, DataLoader& data,
                             MetricsFile* metrics, Progress& progress) {
  const auto& tr = run.settings.train;
  const TrainingPosition at = run.resumed->position;
  scaler.restore(at.scaler);
  data.seek(static_cast<std::uint64_t>(at.step * tr.grad_accum));
  progress.line(resume_text(*run.resumed, tr.steps));
  if (metrics)
    metrics->write(JsonLine()
                       .add("step", at.step)
                       .add("split", "resume")
                       .add("from", run.resumed->dir.string())
                       .add("bytes_read", static_cast<std::int64_t>(run.resumed->bytes_read))
                       .add("bytes_moved", static_cast<std::int64_t>(run.resumed->bytes_moved))
                       .add("seconds", run.resumed->seconds)
                       .add("read_s", run.resumed->read_seconds));
  return at;
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
};

// Its metrics line (rank 0's file) and, off a terminal, its console line.
void log_step(const StepLog& s, MetricsFile* metrics, Progress& progress) {
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
      .add("flops_per_s", s.tokens_per_s * s.flops_per_token)
      .add("bytes_sent", static_cast<std::int64_t>(s.job.bytes_per_rank()))
      .add_comm("comm", s.job.comm)
      .add("comm_wait_s", s.comm_wait_s)
      .add_memory("peak_bytes", s.job.memory, true);
  if (metrics) metrics->write(line);
  if (progress.is_terminal()) return;
  char buf[192];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s",
                static_cast<long long>(s.done), static_cast<long long>(s.steps), s.loss, s.lr,
                s.result.grad_norm, format_rate(s.tokens_per_s).c_str());
  progress.line(buf);
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

// The run's opening lines, from its parts.
RunHeader header_of(const Run& run, const ModelInfo& info, const DataInfo& dinfo) {
  const auto& tr = run.settings.train;
  RunHeader h;
  h.model_plugin = run.model_plugin;
  h.arch = info.arch;
  h.n_params = info.n_params;
  h.data_description = dinfo.description;
  h.strategy_plugin = run.strategy_plugin;
  h.device_name = run.device->name();
  h.micro_batch = tr.micro_batch;
  h.grad_accum = tr.grad_accum;
  h.global_batch = tr.global_batch;
  h.ranks = run.comm->size();
  h.comm_backend = run.strategy_comm().backend();
  h.seq_len = info.seq_len;
  h.entropy_rate = dinfo.entropy_rate;
  h.precision = tr.precision;
  h.grad_dtype = tr.grad_dtype;
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

// The training loop over an assembled run.
// The checkpoint being written, if any: committed at the first step after
// every rank's write is done (learned through the loss all-reduce), one at
// a time; with the host copies and the pruner the next ones reuse.
class CheckpointsInFlight {
 public:
  CheckpointsInFlight(Run& run, MetricsFile* metrics, Progress& progress)
      : run_(run), metrics_(metrics), progress_(progress), buffers_(*run.device) {}
  // This rank's flag for the loss all-reduce.
  bool rank_done() const { return !pending_ || pending_->rank_done(); }
  // After a step: commits what every rank has written; when `due`, starts
  // the checkpoint of `at`, committed at once when it is the last (`last`:
  // no training left to overlap) or was written within the step.
  void after_step(const TrainingPosition& at, bool written_everywhere, bool due, bool last) {
    if (written_everywhere) commit(true);
    if (!due) return;
    commit(true);
    begin_checkpoint(run_, at, buffers_, pruner_, pending_);
    step_ = at.step;
    if (last || pending_->written_in_step()) commit(false);
  }
  // The ranks agreed to stop after the step `at`: the checkpoint being
  // written, if any, is finished and is the one the run stops at (a signal
  // during a large write must not cost a second one); else one of `at` is
  // written. Returns the step of the checkpoint the run stops at.
  std::int64_t stop(const TrainingPosition& at) {
    if (pending_) {
      commit(true);
      return step_;
    }
    after_step(at, false, true, true);
    return at.step;
  }

 private:
  void commit(bool overlapped) {
    if (!pending_) return;
    finish_checkpoint(run_, *pending_, step_, overlapped, metrics_, progress_);
    pending_.reset();
  }

  Run& run_;
  MetricsFile* metrics_;
  Progress& progress_;
  SnapshotBuffers buffers_;  // these two outlive pending_
  CheckpointPruner pruner_;
  std::optional<CheckpointWrite> pending_;
  std::int64_t step_ = 0;
};

// The summary's figures, from the loop's.
RunReport report_of(const Run& run, const TrainResult& result, const ModelInfo& info,
                    const DataInfo& dinfo, const LossScaler& scaler, std::int64_t steps,
                    std::int64_t skipped, double comm_wait, const CommCounters& train_comm,
                    Clock::time_point t_start) {
  const auto& tr = run.settings.train;
  const JobFigures job = gather_job_figures(*run.comm, run.device->stats(), train_comm);
  RunReport report;
  report.steps = steps;
  report.wall_s = seconds_since(t_start);
  report.tokens_per_s = result.tokens_per_s;
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

TrainResult run_training(Run& run, bool overwrite, std::unique_ptr<OutDirLock>& out_dir_lock,
                         Clock::time_point t_start) {
  const auto& tr = run.settings.train;
  const ModelInfo info = run.model->info();
  const DataInfo dinfo = run.data->info();
  // Rank 0 speaks for the job: progress, the run directory, the summary.
  const bool lead = run.comm->rank() == 0;
  const bool resuming = run.resumed.has_value();
  check_outputs(run, info.n_params, overwrite, out_dir_lock);
  Progress progress(tr.steps, lead);
  std::optional<MetricsFile> metrics;
  if (lead) metrics.emplace(open_run_dir(tr.out_dir, run.resolved.toml, run.resumed, progress));

  const auto params = run.model->params();
  const int B = static_cast<int>(tr.micro_batch), T = info.seq_len;
  Arena arena(*run.device);
  LossSum losses(*run.device, *run.kernels);
  DataLoader loader_data(*run.data, B, T, static_cast<int>(tr.grad_accum), run.comm->rank(),
                         run.comm->size());
  const LrSchedule schedule{tr.lr, tr.min_lr, tr.warmup_steps, tr.steps, tr.schedule};

  progress.line(run_header(header_of(run, info, dinfo)));
  for (const auto& note : run.config_notes) progress.line(note);
  if (const std::string epochs = epochs_note(dinfo, tr); !epochs.empty()) progress.line(epochs);
  LossScaler scaler(tr.scaler);
  // Where the loop stands.
  TrainingPosition at =
      resuming ? continue_at(run, scaler, loader_data, metrics ? &*metrics : nullptr, progress)
               : TrainingPosition{};

  TrainResult result;
  result.metrics_file = tr.out_dir / "metrics.jsonl";
  const double tokens_per_step = static_cast<double>(tr.global_batch) * T;
  double train_time = 0;
  // Communication is read from the communicator's counters: `mark` is where
  // the current step's traffic starts (after the previous step's report and
  // evaluation, whose own collectives are not training traffic).
  CommCounters mark = run.counters(), train_comm;
  double comm_wait = 0;
  std::int64_t timed_steps = 0;

  // eval_batches global batches of the val split: the same sequences at any
  // world size and split of the global batch; each rank takes its share.
  auto evaluate = [&](std::int64_t step) {
    const std::int64_t micro_batches = tr.eval_batches * tr.grad_accum;
    for (std::int64_t j = 0; j < micro_batches; ++j) {
      arena.reset();
      StepContext ctx(*run.strategy, params, *run.kernels, arena, losses, 1.0f);
      run.model->evaluate(loader_data.val(j), ctx);
    }
    float mean = static_cast<float>(losses.take() / static_cast<double>(micro_batches));
    run.comm->all_reduce(&mean, 1, DType::f32, ReduceOp::average);
    const double loss = mean;
    result.val_losses.emplace_back(step, loss);
    if (metrics) metrics->write(JsonLine().add("step", step).add("split", "val").add("loss", loss));
    char buf[128];
    std::snprintf(buf, sizeof buf, "eval step %lld | val loss %.4f", static_cast<long long>(step),
                  loss);
    progress.line(buf);
  };

  const OverflowInjection inject = overflow_injection();
  const std::int64_t perturbed_step = lr_perturbation();
  // The first SIGINT/SIGTERM finishes the step, writes a checkpoint and
  // ends the run with exit 0; every rank stops at the same step.
  const StopRequests stop_requests;
  bool stopped = false;
  // A skipped step consumes its batch but neither the optimizer's step
  // count nor the learning-rate schedule (DeepSpeed's engine does the same).
  std::int64_t& applied = at.applied;
  std::int64_t& skipped_steps = at.skipped;
  const std::int64_t first_step = at.step;
  CheckpointsInFlight checkpoints(run, metrics ? &*metrics : nullptr, progress);
  std::int64_t stopped_at = 0;  // the step of the checkpoint a stop ends at
  for (std::int64_t step = first_step; step < tr.steps && !stopped; ++step) {
    const auto t0 = Clock::now();
    const double lr = schedule.at(applied) * (step + 1 == perturbed_step ? 1.1 : 1.0);
    const double scale = scaler.scale();
    for (std::int64_t a = 0; a < tr.grad_accum; ++a) {
      run.strategy->begin_micro_step(a + 1 == tr.grad_accum);
      arena.reset();
      float grad_scale = static_cast<float>(scale / static_cast<double>(tr.grad_accum));
      if (inject.step == step + 1 && inject.rank == run.comm->rank() && a + 1 == tr.grad_accum)
        grad_scale = std::numeric_limits<float>::quiet_NaN();
      StepContext ctx(*run.strategy, params, *run.kernels, arena, losses, grad_scale);
      run.model->forward_backward(loader_data.next(), ctx);
    }
    // The losses are read once the step is queued: on a GPU nothing between
    // the first forward and the update waits for the host. A non-finite loss
    // has non-finite gradients, which step() skips. A stop request travels
    // with the loss average, so every rank learns of any rank's, and so does
    // whether this rank's checkpoint write is done.
    const StepResult sr = run.strategy->step({lr, applied + 1, tr.grad_clip, scale});
    float mean[3] = {static_cast<float>(losses.take() / static_cast<double>(tr.grad_accum)),
                     StopRequests::requested() ? 1.0f : 0.0f,
                     checkpoints.rank_done() ? 1.0f : 0.0f};
    run.comm->all_reduce(mean, 3, DType::f32, ReduceOp::average);
    const double loss = mean[0];
    stopped = mean[1] > 0;
    if (stopped) stop_agreed();
    // Every rank's flag was 1 (an average, so not compared exactly).
    const bool written_everywhere = mean[2] > 1.0f - 0.5f / static_cast<float>(run.comm->size());
    if (!std::isfinite(loss) && !scaler.dynamic())
      throw NumericsError("training loss is " + std::to_string(loss) + " at step " +
                          std::to_string(step + 1) + " (lr " + std::to_string(lr) +
                          "); lower [train] lr, raise warmup_steps or set grad_clip");
    const double next_scale = scaler.update(sr.overflow);
    if (sr.skipped) {
      ++skipped_steps;
      char buf[160];
      std::snprintf(
          buf, sizeof buf,
          "overflow: skipping step %lld (gradients not finite), loss scale %.15g -> %.15g",
          static_cast<long long>(step + 1), scale, next_scale);
      progress.line(buf);
    } else {
      ++applied;
    }
    const double dt = seconds_since(t0);
    const CommCounters step_comm = run.counters().since(mark);
    train_comm += step_comm;
    const double step_wait = run.strategy->stats().comm_wait_s - comm_wait;
    comm_wait += step_wait;
    if (step > first_step || tr.steps == first_step + 1) {  // the first pays for warm-up
      train_time += dt;
      ++timed_steps;
    }
    result.train_losses.push_back(loss);
    const double tps = tokens_per_step / dt;
    const std::int64_t done = step + 1;
    progress.update(done, loss, tps, seconds_since(t_start));
    if (done % tr.log_every == 0 || done == tr.steps || done == 1)
      log_step(
          {done, tr.steps, loss, lr, sr, scale, skipped_steps, dt, tps, info.train_flops_per_token,
           step_wait, gather_job_figures(*run.comm, run.device->stats(), step_comm)},
          metrics ? &*metrics : nullptr, progress);
    if (tr.eval_every > 0 && (done % tr.eval_every == 0 || done == tr.steps)) evaluate(done);
    at.step = done;
    at.scaler = scaler.state();
    if (stopped)
      stopped_at = checkpoints.stop(at);
    else
      checkpoints.after_step(
          at, written_everywhere,
          tr.checkpoint_every > 0 && (done % tr.checkpoint_every == 0 || done == tr.steps),
          done == tr.steps);
    mark = run.counters();
  }
  progress.finish();
  if (stopped) {
    const std::string signal = StopRequests::requested() == SIGINT ? "SIGINT" : "SIGTERM";
    progress.line(
        "stopped at step " + std::to_string(at.step) + " by " + signal + "; " +
        (stopped_at == at.step
             ? std::string("checkpoint above")
             : "the checkpoint of step " + std::to_string(stopped_at) +
                   ", being written when the signal came, is where it stops (" +
                   (at.step == stopped_at + 1 ? "step " + std::to_string(at.step) + " is"
                                              : "steps " + std::to_string(stopped_at + 1) + "-" +
                                                    std::to_string(at.step) + " are") +
                   " trained again)") +
        "; continue with the same command and --resume (the latest checkpoint in " +
        tr.out_dir.string() + "); no final weights were written");
  } else {
    // Every rank takes part (sharded parameters are gathered); rank 0 writes.
    if (tr.save_final) export_weights(*run.model, *run.strategy, tr.out_dir, DType::f32, lead);
    if (!tr.export_to.empty())
      export_weights(*run.model, *run.strategy, tr.export_to, tr.export_dtype, lead);
  }
  result.tokens_per_s =
      timed_steps ? tokens_per_step * static_cast<double>(timed_steps) / train_time : 0;

  RunReport report = report_of(run, result, info, dinfo, scaler, at.step - first_step,
                               skipped_steps, comm_wait, train_comm, t_start);
  if (stopped) report.weights_file.reset();  // a stopped run writes none
  progress.line(summary_text(report));
  return result;
}

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

TrainResult train_run(const TrainArgs& args) {
  const auto t_start = Clock::now();
  JobStart job = start_job([&] { return load_run_config(args); }, args.overwrite);
  // Held until the run and everything it writes are done.
  std::unique_ptr<OutDirLock> out_dir_lock = lock_out_dir(resolve_out_dir(job.config), *job.comm);
  const PluginLoader loader = command_line_loader(args.plugin_paths, args.verbose);
  const std::string strategy = job.config.plugin("strategy", "ddp");
  Run run =
      with_memory_hint(strategy, [&] { return assemble(std::move(job.comm), job.config, loader); });
  try {
    return with_memory_hint(
        strategy, [&] { return run_training(run, job.overwrite, out_dir_lock, t_start); });
  } catch (const std::exception& e) {
    // With other ranks, unwinding the run waits for collectives they may
    // never finish (until [comm] timeout aborts the job): say what went
    // wrong first.
    if (run.comm->size() == 1) throw;
    const bool config_error = dynamic_cast<const ConfigError*>(&e) != nullptr;
    std::fprintf(stderr, "[rank %d] ztrain: %s: %s\n", run.comm->rank(),
                 config_error ? "config error" : "error", e.what());
    std::fflush(stderr);
    throw ReportedError(e.what(), config_error ? 2 : 1);
  }
}

void estimate_run(const TrainArgs& args, int world, std::ostream& os) {
  const RunConfig config = load_run_config(args);
  const PluginLoader loader = command_line_loader(args.plugin_paths, args.verbose);
  const RunParts parts = make_run_parts(config, loader, world);
  const RunSettings& settings = parts.settings;
  const ModelInfo& info = parts.info;
  const std::string& model_name = parts.model_plugin;
  const std::string& strategy_name = parts.strategy_plugin;
  MemoryEstimate e = parts.strategy->estimate(parts.sizes);
  e.bytes[static_cast<std::size_t>(Tier::device)]
         [static_cast<std::size_t>(Category::activations)] += parts.sizes.activation_bytes;
  os << "estimate: strategy " << strategy_name << ", " << world << " rank" << (world > 1 ? "s" : "")
     << ", model " << model_name << " (" << info.arch << ", " << info.n_params
     << " params), micro-batch " << settings.train.micro_batch << " x " << info.seq_len
     << " tokens, " << precision_label(settings.train.precision) << " weights and "
     << precision_label(settings.train.grad_dtype) << " gradients"
     << (settings.train.precision != DType::f32 ? " (fp32 master weights in optimizer)" : "")
     << "\n";
  if (!e.note.empty()) os << strategy_name << ": " << e.note << "\n";
  os << "peak bytes per rank:\n";
  for (std::size_t t = 0; t < kTierCount; ++t) {
    std::uint64_t total = 0;
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      const std::uint64_t b = e.bytes[t][c];
      if (!b) continue;
      total += b;
      char line[128];
      std::snprintf(line, sizeof line, "  %-7s %-12s %14llu  %s\n",
                    std::string(tier_name(static_cast<Tier>(t))).c_str(),
                    std::string(category_name(static_cast<Category>(c))).c_str(),
                    static_cast<unsigned long long>(b), format_bytes(b).c_str());
      os << line;
    }
    if (total) {
      char line[128];
      std::snprintf(line, sizeof line, "  %-7s %-12s %14llu  %s\n",
                    std::string(tier_name(static_cast<Tier>(t))).c_str(), "total",
                    static_cast<unsigned long long>(total), format_bytes(total).c_str());
      os << line;
    }
  }
  os << "(each category's peak; they need not coincide, so a tier's total is an upper bound)\n";
}

}  // namespace

void estimate(const TrainArgs& args, int world, std::ostream& os) {
  try {
    estimate_run(args, world, os);
  } catch (...) {
    rethrow_detached();
  }
}

ReportedError::~ReportedError() = default;

namespace {

// `resume = true` is "latest" (and false: no resume), shorthand for the
// string option; the value keeps its origin.
void resume_shorthand(RunConfig& config) {
  const toml::node* v = config.table().at_path("train.resume").node();
  if (!v || !v->is_boolean()) return;
  toml::table value;
  value.insert("resume", v->as_boolean()->get() ? "latest" : "");  // "": no resume
  config.set_imported("train", value, false, {{"train.resume", config.where("train.resume")}});
}

}  // namespace

RunConfig load_run_config(const TrainArgs& args) {
  RunConfig config = RunConfig::load(args.config, args.model, args.strategy, args.overrides,
                                     config_roots(args.config));
  resume_shorthand(config);
  if (args.deepspeed.empty()) {
    inherit_resumed_run(config);
    return config;
  }
  if (!args.strategy.empty())
    throw ConfigError("--deepspeed " + args.deepspeed.string() +
                      " gives the strategy; drop --strategy " + args.strategy);
  const ImportedConfig imported = import_deepspeed(args.deepspeed, config);
  config.set_imported("strategy", imported.strategy, true, imported.origins);
  config.set_imported("train", imported.train, false, imported.origins);
  for (const auto& o : args.overrides) config.override_with(o);
  resume_shorthand(config);
  inherit_resumed_run(config);
  for (const auto& n : imported.notes) config.add_note(n);
  for (const auto& w : imported.warnings) config.add_note("warning: " + w);
  return config;
}

Run assemble(std::unique_ptr<Communicator> comm, const RunConfig& config,
             const PluginLoader& loader) {
  try {
    return assemble_run(std::move(comm), config, loader);
  } catch (...) {
    rethrow_detached();
  }
}

Run assemble(const RunConfig& config, const PluginLoader& loader) {
  return assemble(make_communicator(resolve_comm(config)), config, loader);
}

std::string resolved_config_of(const TrainArgs& args) {
  const RunConfig config = load_run_config(args);
  return resolve_config(config, command_line_loader(args.plugin_paths, args.verbose)).toml;
}

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
