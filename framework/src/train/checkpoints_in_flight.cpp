#include "train/checkpoints_in_flight.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>

#include "comm/world.h"
#include "job/memory_check.h"
#include "ztrain/units.h"
#include "ztrain/version.h"

namespace ztrain {
namespace {

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

}  // namespace

// The copy of the state may take half the memory the host has left,
// shared by its ranks, beside the copies kept from the last checkpoint.
void CheckpointsInFlight::begin(const TrainingPosition& at) {
  const auto& tr = run_.settings.train;
  const std::uint64_t allowance =
      writes_in_background(run_)
          ? available_memory() / (2 * static_cast<std::uint64_t>(local_rank_count())) +
                buffers_.kept_bytes()
          : 0;
  const int tensor_rank = run_.comm->rank() % run_.settings.parallel.tensor;
  pending_.emplace(
      CheckpointTarget{tr.out_dir, tr.keep_last, allowance, kill_, tensor_rank, run_.whole_params},
      checkpoint_header(run_, at), run_.model->params(), *run_.strategy, buffers_, pruner_,
      *run_.comm);
  step_ = at.step;
}

void CheckpointsInFlight::commit(bool overlapped) {
  if (!pending_) return;
  const CheckpointWritten w = pending_->finish();
  pending_.reset();
  const std::int64_t step = step_;
  MetricsFile* metrics = metrics_;
  Progress& progress = progress_;
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
  if (run_.comm->rank() != 0) return;
  char line[160];
  std::snprintf(line, sizeof line, " in %.3f s (%s/s); training held %.3f s%s", w.seconds,
                format_bytes(static_cast<std::uint64_t>(static_cast<double>(w.bytes) /
                                                        std::max(w.seconds, 1e-9)))
                    .c_str(),
                w.held_s, overlapped ? ", the rest written while training went on" : "");
  progress.line("checkpoint " + w.dir.string() + ": " + format_bytes(w.bytes) + line);
}

}  // namespace ztrain
