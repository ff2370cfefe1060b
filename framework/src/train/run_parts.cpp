#include "train/run_parts.h"

#include <algorithm>
#include <tuple>

#include "config/section_options.h"
#include "job/memory_check.h"
#include "train/pipeline_step.h"
#include "ztrain/error.h"
#include "ztrain/pipeline/schedule.h"
#include "ztrain/pipeline/stage_partition.h"

namespace ztrain {
namespace {

// Each degree alone, naming its key, then the two together, naming both:
// the model's reason for the first split it cannot run.
void check_split(const RunConfig& config, const Model& model, SequenceSplit both) {
  const std::string S = std::to_string(both.sequence), R = std::to_string(both.context);
  const std::tuple<SequenceSplit, const char*, std::string> tries[] = {
      {{both.sequence, 1}, "sequence", "sequence = " + S},
      {{1, both.context}, "context", "context = " + R},
      {both, "context", "sequence = " + S + " x context = " + R}};
  for (const auto& [split, key, set] : tries)
    if (const std::string why = model.sequence_shards_refusal(split); !why.empty())
      throw ConfigError(config.where(std::string("parallel.") + key) + ": [parallel] " + set +
                        ": " + why + "; choose a degree that divides them, or 1");
}

// Tensor parallelism: the model made this rank's part of the split, or
// the run refused naming why.
void split_model(const RunConfig& config, const RunParts& p, int rank) {
  const int degree = p.settings.parallel.tensor;
  if (degree <= 1) return;
  const TensorParallel t{degree, rank % degree, p.settings.parallel.tensor_sequence};
  if (const std::string why = p.model->split_tensors(t); !why.empty())
    throw ConfigError(config.where("parallel.tensor") +
                      ": [parallel] tensor = " + std::to_string(degree) + ": " + why);
}

// The schedule [parallel] pipeline_schedule names: built in, or a plugin
// of kind "schedule" whose options are [schedule]'s (a built-in one takes
// none). Its file joins the plugins the ranks compare.
std::shared_ptr<pipeline::PipelineSchedule> run_schedule(const RunConfig& config, RunParts& p,
                                                         const PluginLoader& loader) {
  const std::string& name = p.settings.parallel.pipeline_schedule;
  if (pipeline::is_builtin_schedule(name)) {
    config.validate("schedule", OptionList{});
    return pipeline::builtin_schedule(name);
  }
  const LoadedPlugin lib = [&] {
    try {
      return loader.load("schedule", name);
    } catch (const PluginError& e) {
      throw ConfigError(
          config.where("parallel.pipeline_schedule") + ": [parallel] pipeline_schedule = \"" +
          name + "\" is not a built-in schedule (gpipe, 1f1b, interleaved), and " + e.what());
    }
  }();
  p.plugins.push_back({"schedule " + name, lib.file(), lib.info().version});
  return lib.create<pipeline::PipelineSchedule>(plugin_options(config, "schedule", lib, {}));
}

// The schedule's plan for the run's shape (grad_accum micro-batches),
// checked now: a shape it cannot run is refused before anything is built.
void plan_schedule(const RunConfig& config, RunParts& p, const PluginLoader& loader) {
  const ParallelSettings& par = p.settings.parallel;
  const pipeline::ScheduleShape shape{static_cast<std::size_t>(par.pipeline),
                                      static_cast<std::size_t>(p.settings.train.grad_accum),
                                      static_cast<std::size_t>(par.pipeline_chunks)};
  const auto schedule = run_schedule(config, p, loader);
  try {
    p.pipeline_plan = schedule->plan(shape);
    if (!(p.pipeline_plan.shape == shape)) throw ConfigError("it wrote a plan for another shape");
    pipeline::check_schedule(p.pipeline_plan);
  } catch (const ConfigError& e) {
    throw ConfigError(config.where("parallel.pipeline_schedule") +
                      ": [parallel] pipeline_schedule = \"" + par.pipeline_schedule + "\" over " +
                      std::to_string(shape.micro_batches) +
                      " micro-batches ([train] grad_accum): " + e.what());
  }
}

// Pipeline parallelism: the modules cut into stages x chunks virtual
// stages, the schedule planned, and the model made this rank's stage (the
// outermost mesh dimension: stage = rank / (world / stages)), or the run
// refused naming why.
void split_stages(const RunConfig& config, RunParts& p, PartsFor job, const PluginLoader& loader) {
  const ParallelSettings& par = p.settings.parallel;
  if (par.pipeline <= 1) {
    config.validate("schedule", OptionList{});  // [schedule] has no use without a pipeline
    return;
  }
  p.whole_params = p.model->params();
  const auto stages = static_cast<std::size_t>(par.pipeline);
  const std::size_t parts = stages * static_cast<std::size_t>(par.pipeline_chunks);
  try {
    p.pipeline_bounds = pipeline::partition_modules(
        pipeline::module_weights(p.whole_params, p.model->modules().size()), parts,
        pipeline::partition_method(par.pipeline_partition));
  } catch (const ConfigError& e) {
    throw ConfigError(config.where("parallel.pipeline") +
                      ": [parallel] pipeline = " + std::to_string(par.pipeline) +
                      " x pipeline_chunks = " + std::to_string(par.pipeline_chunks) + ": " +
                      e.what());
  }
  plan_schedule(config, p, loader);
  p.pipeline_stage = static_cast<std::size_t>(job.rank / (job.world / par.pipeline));
  const std::string why =
      p.model->split_stages(pipeline::stage_chunks(p.pipeline_bounds, stages, p.pipeline_stage));
  if (!why.empty())
    throw ConfigError(config.where("parallel.pipeline") +
                      ": [parallel] pipeline = " + std::to_string(par.pipeline) + ": " + why);
  if (const std::string no = p.strategy->pipeline_refusal(); !no.empty())
    throw ConfigError(config.where("parallel.pipeline") +
                      ": [parallel] pipeline = " + std::to_string(par.pipeline) +
                      " with strategy '" + p.strategy_plugin + "': " + no);
}

}  // namespace

RunParts make_run_parts(const RunConfig& config, const PluginLoader& loader, PartsFor job) {
  const int world = job.world, ranks_here = job.ranks_here;
  config.check_sections(run_file_sections());
  RunParts p;
  p.settings = resolve_settings(config, world);
  p.model_plugin = config.plugin("model", "transformer");
  p.data_plugin = config.plugin("data", "synthetic");
  p.strategy_plugin = config.plugin("strategy", "ddp");
  const LoadedPlugin model_lib = loader.load("model", p.model_plugin);
  p.data_lib = loader.load("data", p.data_plugin);
  const LoadedPlugin strategy_lib = loader.load("strategy", p.strategy_plugin);

  for (const auto& [kind, name, lib] : {std::tuple{"model", &p.model_plugin, &model_lib},
                                        {"data", &p.data_plugin, &p.data_lib},
                                        {"strategy", &p.strategy_plugin, &strategy_lib}})
    p.plugins.push_back({std::string(kind) + " " + *name, lib->file(), lib->info().version});

  // Every section validated before anything is created.
  p.model_options = plugin_options(config, "model", model_lib, model_host_options());
  p.data_options = plugin_options(config, "data", p.data_lib, data_host_options());
  const Options strategy_options = plugin_options(config, "strategy", strategy_lib, OptionList{});

  p.model = model_lib.create<Model>(p.model_options);
  split_model(config, p, job.rank);
  p.strategy = strategy_lib.create<Strategy>(strategy_options);
  split_stages(config, p, job, loader);
  // A model that freezes parameters: the strategy trains the rest.
  if (has_frozen(p.model->params())) {
    p.frozen = std::make_shared<FrozenSplit>(p.strategy);
    p.strategy = p.frozen;
  }
  p.info = p.model->info();
  const ParallelSettings& par = p.settings.parallel;
  check_split(config, *p.model, par.split());
  const int shards = par.split().shards();
  const auto& tr = p.settings.train;
  const BatchShape micro{static_cast<int>(tr.micro_batch), p.info.seq_len / shards, par.split(),
                         tr.activation_dtype};
  p.sizes = {p.model->params(),
             world / (par.tensor * par.pipeline),
             tr.precision,
             tr.grad_dtype,
             p.model->activation_bytes(micro),
             p.model->host_activation_bytes(micro),
             p.settings.device.memory_limit,
             p.settings.device.kind != "cuda" && !p.settings.device.guard,
             std::nullopt};
  if (par.pipeline > 1) {  // the micro-batches the schedule holds, and what passes between them
    const std::uint64_t kept = p.model->kept_activation_bytes(micro);
    if (kept > p.sizes.activation_bytes)
      throw InternalError("model '" + p.model_plugin + "' keeps more activation bytes (" +
                          std::to_string(kept) + ") than one micro-step allocates");
    p.sizes.activation_bytes = stage_activations(
        p.pipeline_plan, p.pipeline_stage,
        {kept, p.sizes.activation_bytes - kept, p.model->stage_floats(micro) * sizeof(float)});
  }
  if (const std::uint64_t ram = physical_memory(); ram > 0 && ranks_here > 0)
    p.sizes.host_budget = ram / static_cast<std::uint64_t>(ranks_here);
  return p;
}

}  // namespace ztrain
