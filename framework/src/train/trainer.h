// The trainer: the training loop over an assembled run (run_assembly.h):
// micro-steps, the optimizer step, what the ranks agree on after it
// (step_agreement.h), evaluation, text samples (generation.h), metrics,
// progress, checkpoints, the stop a signal asks for, the final weights and
// the summary.
//
// Errors: ConfigError before anything runs for bad configs; PluginError,
// DataError, OutOfMemoryError, NumericsError as they arise. At world > 1,
// train() prints what went wrong on this rank before unwinding and raises
// ReportedError.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/signals.h"
#include "io/fault_plan.h"
#include "job/out_dir_lock.h"
#include "text/tokenizer.h"
#include "train/checkpoints_in_flight.h"
#include "train/data_loader.h"
#include "train/loss_scaler.h"
#include "train/metrics.h"
#include "train/pipeline_step.h"
#include "train/progress.h"
#include "train/run_assembly.h"
#include "train/tensorboard.h"
#include "ztrain/model.h"

namespace ztrain {

struct TrainResult {
  std::vector<double> train_losses;  // one per optimizer step
  std::vector<std::pair<std::int64_t, double>> val_losses;
  double tokens_per_s = 0;
  // The trained tokens (targets not masked) a second, over every rank;
  // unset when the data masks none (every token is trained).
  std::optional<double> trained_per_s;
  std::filesystem::path metrics_file;
};

// The loop over an assembled run whose outputs are checked. Constructing
// it opens the run directory (rank 0), prints the run's header and, for a
// resumed run, continues the scaler, the data and the metrics from the
// checkpoint's position; train() runs the steps left and ends the run.
//
// Members are destroyed in reverse order of declaration: the checkpoint in
// flight (declared last) is finished or abandoned first, while the metrics
// file, the progress line and the run it refers to still exist; the data
// loader's prefetch thread stops before the run's data source goes.
class Trainer {
 public:
  using Clock = std::chrono::steady_clock;
  Trainer(Run& run, const FaultPlan& faults, Clock::time_point t_start);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  TrainResult train();

 private:
  void resume();
  // One optimizer step (0-based `step`): its micro-steps, the strategy's
  // step, the agreement, the bookkeeping after it.
  void train_step(std::int64_t step);
  // The step's micro-batches, each trained token's loss gradient scaled by
  // scale x ranks / trained (the step's trained tokens on every rank).
  void micro_steps(std::int64_t step, double scale, std::uint64_t trained);
  // The trained tokens of the step about to run, on every rank; DataError
  // when there are none.
  std::uint64_t step_tokens(std::int64_t step);
  // Trained tokens summed over the ranks, from this rank's count.
  std::uint64_t on_every_rank(std::uint64_t mine);
  // What a rank's mean per-token loss over `micro` micro-batches is
  // multiplied by so that its average over the ranks is the mean over the
  // `trained` tokens of every rank: 1 when every token is trained.
  double trained_factor(std::int64_t micro, std::uint64_t trained) const;
  // The scaler and the step counts after a step; a fixed scale's
  // non-finite loss is an error.
  void count_step(const StepResult& sr, double loss, double lr, double scale, std::int64_t step);
  // Time, traffic and memory of the step, logged.
  // `trained`: the step's trained tokens on every rank.
  void record_step(const StepResult& sr, double loss, double lr, double scale, std::int64_t done,
                   std::uint64_t trained, Clock::time_point t0);
  void evaluate(std::int64_t step);
  // Pipeline parallelism: the step's micro-batches through the stage's
  // schedule; what each action's context is made of; what this rank's
  // losses weigh in the average over the ranks (1 without a pipeline).
  void pipeline_step(std::int64_t step, float token_scale);
  StageContextParts stage_parts();
  double loss_weight() const;
  // A batch from the loader with the type its activations are kept in.
  Batch with_activations(Batch batch) const;
  // [train] sample_every: rank 0's tokenizer and prompt ids (the data's
  // document-start token, then sample_prompt's ids).
  void open_sampling();
  // A text sample after step `step`, printed and written to metrics.jsonl
  // by rank 0; every rank takes part in its forwards.
  void sample(std::int64_t step);
  // The checkpoint due after step `done`, or the one a stop ends at.
  void checkpoint_after(std::int64_t done, bool written_everywhere);
  // The stop's message, or the final weights.
  void finish();
  void summarize();

  Run& run_;
  const TrainSettings& tr_;
  const FaultPlan faults_;
  const Clock::time_point t_start_;
  const ModelInfo info_;
  const DataInfo data_info_;
  const ParamSpecs params_;
  Progress progress_;
  std::optional<MetricsFile> metrics_;          // rank 0's
  std::optional<TensorBoardFile> tensorboard_;  // rank 0's, with [train] tensorboard
  Arena arena_;
  LossSum losses_;
  DataLoader data_;
  LossScaler scaler_;
  TrainingPosition at_;  // where the loop stands: the next step, the scaler
  std::int64_t first_step_ = 0;
  TrainResult result_;
  // Timing and traffic: `mark_` is where the current step's traffic starts
  // (after the previous step's report and evaluation, whose collectives
  // are not training traffic).
  double train_time_s_ = 0, comm_wait_s_ = 0, timed_trained_ = 0;
  std::int64_t timed_steps_ = 0;
  CommCounters mark_, train_comm_;
  std::unique_ptr<text::Tokenizer> sample_tokenizer_;  // rank 0's, with sample_every
  std::vector<std::int32_t> sample_prompt_;            // rank 0's
  std::optional<std::int32_t> sample_stop_;            // the document-start token
  bool stopped_ = false;         // the ranks agreed to stop (a signal; train())
  std::int64_t stopped_at_ = 0;  // the step of the checkpoint a stop ends at
  // Pipeline parallelism: this stage's executor; null with one stage.
  std::unique_ptr<PipelineStep> pipeline_;
  CheckpointsInFlight checkpoints_;
};

// An error a rank has already printed (as `[rank N] ztrain: error: ...`)
// before unwinding its run; the caller only exits with exit_code.
class ReportedError : public Error {
 public:
  ReportedError(const std::string& message, int exit_code)
      : Error(message), exit_code_(exit_code) {}
  ~ReportedError() override;
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Assembles the run of `args` and trains it (train_run: the job started,
// out_dir locked, outputs checked). Raises ReportedError for what went
// wrong during training at world > 1.
TrainResult train(const TrainArgs& args);

}  // namespace ztrain
