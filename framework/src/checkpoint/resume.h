// Continuing a run from a checkpoint.
//
// resume_from finds the checkpoint (train.resume: "latest" for out_dir's,
// a step_<N> directory, or a run directory), checks it against this run's
// model and configuration on every rank (any rank's refusal stops all),
// then has the strategy load the state each rank now owns, whatever world
// size and strategy wrote it, and returns where training stands. When
// some ranks cannot see the checkpoint (a host without the directory),
// rank 0 checks it, sends its manifest and each rank exactly the ranges its
// strategy holds (state_relay.h).
//
// check_resume says whether a run may continue a checkpoint: the keys that
// change what is trained must be the checkpoint's; the others may change
// and are said.
//
// May change: the number of steps (and with it the end of the
// learning-rate schedule), logging, evaluation, checkpointing and output
// keys, how the global batch is split (micro_batch_size, grad_accum: the
// world size may change), and the whole of [strategy], [device] and
// [comm]. Everything else (the model, the data and its seed, the
// precision, the optimizer and schedule settings, the seed) must equal the
// checkpoint's, and so must the global batch size. A refusal names the
// first key that differs with both values.
//
// Errors: ConfigError for a refused resume or a checkpoint that is not
// there; DataError for a corrupt one (naming the file and range).
// Thread safety: resume_from is collective; check_resume is pure.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/manifest.h"
#include "config/config.h"
#include "ztrain/comm.h"
#include "ztrain/strategy.h"

namespace ztrain {

// now: this run's resolved keys; global_batch: its global batch size.
// Returns "key: old -> new" for each key that changed and may.
std::vector<std::string> check_resume(const Manifest& checkpoint,
                                      const std::vector<std::pair<std::string, std::string>>& now,
                                      std::int64_t global_batch, const std::string& where);

struct Resumed {
  std::filesystem::path dir;
  TrainingPosition position;
  std::vector<std::string> changes;  // check_resume's
  int world = 0;                     // of the run that wrote it
  std::uint64_t bytes_read = 0;      // by this rank
  bool from_rank_0 = false;          // rank 0 sent the ranks that cannot see it their state
  std::uint64_t bytes_moved = 0;     // then: between ranks, summed over them
  double seconds = 0;                // the whole resume: checks, reads, the strategy's placing
  double read_seconds = 0;           // of which reading and checking the state
};

struct ResumeRequest {
  std::string resume;  // train.resume
  std::filesystem::path out_dir;
  ParamSpecs params;  // the model's: a tensor-parallel rank's parts
  std::vector<std::pair<std::string, std::string>> keys;  // this run's resolved keys
  std::int64_t global_batch = 0;
  std::int64_t steps = 0;  // train.steps: the checkpoint must be before it
  // Under pipeline parallelism the whole model's parameters, which the
  // checkpoint must list (params: the stage's); empty: params.
  ParamSpecs model_params = {};
};

Resumed resume_from(const ResumeRequest& request, Strategy& strategy, Communicator& comm);

// A resumed run (train.resume set) continues the checkpoint's run as that
// run was set: every key its config.toml sets (its defaults are comments
// there) is taken, with the checkpoint as its origin, unless this command
// line sets it (--set, a --model or --strategy preset, a DeepSpeed config);
// this run's file yields as well, and a note lists what was taken and
// which values of the file were not kept. So `--resume` with the same run
// file continues a run started with --set options. A section whose plugin
// this command line replaced takes nothing; one whose plugin only the file
// differs in is the checkpoint's, whole. Not taken: grad_accum (it follows
// from the global batch, the micro-batch and the world size). Does nothing
// when the checkpoint cannot be found or read: resume_from says why.
void inherit_resumed_run(RunConfig& config);

}  // namespace ztrain
