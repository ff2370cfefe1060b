// RunParts: what a run is made of before any rank, device or memory
// exists: its settings for a world size, its model and strategy created
// from their plugins (every section's options validated first), and the
// sizes the strategy's estimate and its setup both read. assemble() builds
// the run on them, and `estimate` and `estimate --all` read only them, so
// an estimate is of the run that would start. The data source is left to
// the run: creating it may open its files, which sizing does not need.
// Part of the host. Errors: ConfigError and PluginError, as loading
// the config and the plugins raise them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/run_settings.h"
#include "job/rank_agreement.h"
#include "loader/plugin_loader.h"
#include "train/frozen_split.h"
#include "ztrain/data.h"
#include "ztrain/model.h"
#include "ztrain/pipeline/schedule.h"
#include "ztrain/strategy.h"

namespace ztrain {

struct RunParts {
  RunSettings settings;
  std::string model_plugin, data_plugin, strategy_plugin;
  Options model_options;
  LoadedPlugin data_lib;
  Options data_options;
  std::shared_ptr<Model> model;
  std::shared_ptr<Strategy> strategy;
  // The strategy, when the model freezes parameters (train/frozen_split.h):
  // the frozen values are loaded through it; null otherwise.
  std::shared_ptr<FrozenSplit> frozen;
  ModelInfo info;
  std::vector<InstalledPart> plugins;  // the three plugins' files, for the ranks to compare
  // Pipeline parallelism (one stage: empty): the bounds of the stages x
  // chunks virtual stages over the model's modules, and the whole model's
  // parameters (before this rank's stage kept its own), whose used_by say
  // which stages hold a tied one.
  std::vector<std::size_t> pipeline_bounds;
  ParamSpecs whole_params;
  // The schedule's checked plan for the step's micro-batches.
  pipeline::SchedulePlan pipeline_plan;
  // This rank's stage (0 without a pipeline).
  std::size_t pipeline_stage = 0;
  // For `world` ranks: the model's parameters, the precisions, one
  // micro-batch's activations (a pipeline stage's: what its schedule
  // holds at once, train/pipeline_step.h's stage_activations), [device]
  // memory_limit and each rank's share of this machine's RAM.
  EstimateArgs sizes;
};

// Whom the parts are for: a job of `world` ranks, `ranks_here` of them
// sharing this machine's RAM, this process being rank `rank` (an estimate's
// is 0: under tensor parallelism, the model's first part; under pipeline
// parallelism, its first stage).
struct PartsFor {
  int world = 1;
  int ranks_here = 1;
  int rank = 0;
};
RunParts make_run_parts(const RunConfig& config, const PluginLoader& loader, PartsFor job);

}  // namespace ztrain
