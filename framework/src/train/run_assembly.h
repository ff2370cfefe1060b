// Assembling a run: its configuration loaded (presets, a DeepSpeed
// config, --set overrides), then every section and plugin validated and
// the parts made on every rank: device, kernels, communicators, model,
// data, strategy (set up, its memory checked first), and the checkpoint or
// weights it starts from. Nothing is trained (train/trainer.h trains).
//
// Errors: ConfigError for bad configs, PluginError, DataError and
// OutOfMemoryError as the parts are made; every rank raises together where
// one rank's failure would leave the others waiting.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "checkpoint/resume.h"
#include "checkpoint/weights_import.h"
#include "config/config.h"
#include "config/resolved_config.h"
#include "config/run_settings.h"
#include "core/host_threads.h"
#include "io/fault_plan.h"
#include "job/mesh_groups.h"
#include "job/mesh_plan.h"
#include "loader/plugin_loader.h"
#include "ztrain/comm.h"
#include "ztrain/data.h"
#include "ztrain/device.h"
#include "ztrain/kernels.h"
#include "ztrain/model.h"
#include "ztrain/pipeline/schedule.h"
#include "ztrain/strategy.h"

namespace ztrain {

class FailurePoints;  // train/failure_points.h

struct TrainArgs {
  std::filesystem::path config;
  std::string model;                   // --model preset; empty: keep [model]
  std::string strategy;                // --strategy (preset or plugin); empty: keep [strategy]
  std::vector<std::string> overrides;  // --set section.key=value
  std::vector<std::string> plugin_paths;
  bool verbose = false;
  bool overwrite = false;  // --overwrite: replace an earlier run in out_dir, an existing export
  std::filesystem::path deepspeed;   // --deepspeed ds.json; empty: none
  std::filesystem::path accelerate;  // --accelerate-config default_config.yaml; empty: none
  // --llamafactory train.yaml: the run is LLaMA-Factory's YAML (config
  // empty), config/llamafactory_import.h; empty: none.
  std::filesystem::path llamafactory;
  // The faults a test asks this run to suffer (read once by main()).
  FaultPlan faults;
};

// Where presets are looked up (each root holds strategies/ and models/): the
// run file's directory, the installed share/ztrain/configs, the source tree.
std::vector<std::filesystem::path> config_roots(const std::filesystem::path& run_file);

// The run file with its presets, the DeepSpeed config when one is given
// (deepspeed_import.h: its [strategy] and [train] keys, notes for what
// "auto" became), and the --set overrides, which win over both.
RunConfig load_run_config(const TrainArgs& args);

// Everything a run is made of, built and validated from a RunConfig.
//
// Members are destroyed in reverse order of declaration, and the order
// matters: the strategy (its buffers on the device, collectives it may
// still finish) goes before the model and data it was set up with, before
// the communicators and before the kernels and device; gpu_comm (nccl on
// the device, bootstrapped through comm) before comm; the kernels before
// the device they run on.
struct Run {
  RunSettings settings;
  std::unique_ptr<Device> device;
  std::unique_ptr<Kernels> kernels;
  // Where kernels are not the cpu's (a GPU, the guarded device): the cpu
  // kernels for state offloaded to host memory, and on a GPU the limit on
  // their threads (the cpu device holds its own).
  std::unique_ptr<Kernels> host_kernels;
  std::unique_ptr<HostThreads> host_threads;
  std::unique_ptr<Communicator> comm;
  // On a GPU: the nccl communicator of the strategy's collectives (comm
  // meets the ranks and carries the trainer's host-side scalars).
  std::unique_ptr<Communicator> gpu_comm;
  // The device mesh ([parallel]) and, when a dimension other than data is
  // above 1, this rank's group along each, split from strategy_comm().
  MeshPlan mesh;
  std::optional<MeshGroups> mesh_groups;
  std::shared_ptr<Model> model;
  // Pipeline parallelism (RunParts): the virtual stages' bounds over the
  // modules, the whole model's parameters and the schedule's plan; empty
  // with one stage.
  std::vector<std::size_t> pipeline_bounds;
  ParamSpecs whole_params;
  pipeline::SchedulePlan pipeline_plan;  // checked
  std::shared_ptr<DataSource> data;
  std::shared_ptr<Strategy> strategy;
  std::string model_plugin, data_plugin, strategy_plugin;
  std::uint64_t data_seed = 0;
  std::filesystem::path init_from;        // empty: initialised from the seed
  WeightsImport weights_import;           // how init_from reached the ranks
  ResolvedConfig resolved;                // every key, defaults included
  std::vector<std::string> config_notes;  // RunConfig::notes(), printed after the header
  std::string placement;  // each rank's host and GPU (job/placement.h); empty: one cpu rank
  std::string cores;      // how ranks sharing a host split its cores (job/core_share.h)

  std::optional<Resumed> resumed;  // continuing a checkpoint
  // A test's injected failure, around strategy and comm
  // (train/failure_points.h); null for none.
  std::shared_ptr<FailurePoints> failure_points;
  // What the strategy's estimate reads (make_run_parts): the run's report
  // sets the measured peaks beside the same estimate the memory check used.
  EstimateArgs sizes;

  // What the strategy's communicator moves (every collective of the job
  // when there is no gpu_comm).
  Communicator& strategy_comm() const { return gpu_comm ? *gpu_comm : *comm; }
  // This rank's group along mesh dimension d; null where d's size is 1.
  Communicator* group_of(MeshDim d) const {
    return mesh.size(d) > 1 ? &(*mesh_groups)[d] : nullptr;
  }
  // The counters of both communicators.
  CommCounters counters() const {
    CommCounters c = comm->counters();
    if (gpu_comm) c += gpu_comm->counters();
    return c;
  }
};

// Loads and validates every section and plugin, sets up device, data and
// strategy, and loads the checkpoint a resumed run continues. Nothing is
// trained. `comm` is the job's (job_start.h); without it, the one the
// configuration's [comm] section asks for.
Run assemble(std::unique_ptr<Communicator> comm, const RunConfig& config,
             const PluginLoader& loader);
Run assemble(const RunConfig& config, const PluginLoader& loader);

// `ztrain config`: every key of the run, defaults included, as TOML.
// Validates the run as it would start at `world` ranks (every section, the
// plugins' options, the batch identity, the schedule) without running it;
// ConfigError on what the run would refuse.
void check_run(const TrainArgs& args, int world);
std::string resolved_config_of(const TrainArgs& args);

// `ztrain estimate`: the strategy's bytes per tier and category for one
// rank of a `world`-rank run, plus the model's activations, printed to os.
// Nothing is allocated or trained.
void estimate(const TrainArgs& args, int world, std::ostream& os);

}  // namespace ztrain
