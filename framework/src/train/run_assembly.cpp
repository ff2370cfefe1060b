#include "train/run_assembly.h"

#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "checkpoint/adapter_import.h"
#include "checkpoint/hf_export.h"
#include "comm/world.h"
#include "config/accelerate_import.h"
#include "config/deepspeed_import.h"
#include "config/hf_model_import.h"
#include "config/llamafactory_import.h"
#include "config/section_options.h"
#include "core/host_name.h"
#include "job/core_share.h"
#include "job/cpu_affinity.h"
#include "job/guarded_device.h"
#include "job/job_start.h"
#include "job/memory_check.h"
#include "job/placement.h"
#include "job/rank_agreement.h"
#include "kernels/cpu/blas.h"
#include "loader/cuda_loader.h"
#include "text/sft_reader.h"
#include "text/tokenizer.h"
#include "train/run_parts.h"
#include "train/tokenized_examples.h"
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

// The data source, made and set up on every rank, its files compared
// across ranks. A rank that cannot open its files (missing on its host)
// stops every rank, saying so with its host's name.
// A model directory's own tokenizer must be the one the training tokens
// were made with: ids mean tokens only under their tokenizer, and the
// export would ship the directory's.
void check_tokenizers_agree(const RunConfig& config, const RunParts& parts, const DataInfo& d) {
  if (!parts.model_options.has_value("init_from")) return;
  const std::filesystem::path mine =
      text::tokenizer_in(parts.model_options.get_string("init_from"));
  if (mine.empty()) return;
  std::string theirs = d.tokenizer_identity;
  if (theirs.empty() && !d.tokenizer.empty()) theirs = text::tokenizer_identity(d.tokenizer);
  if (theirs.empty()) return;
  const std::string ours = text::tokenizer_identity(mine);
  if (ours == theirs) return;
  throw ConfigError(
      config.where("model.init_from") + ": the model directory's tokenizer " + mine.string() +
      " (identity " + ours + ") is not the one the training tokens were made with, " +
      (d.tokenizer.empty() ? std::string("identity ") + theirs
                           : d.tokenizer + " (identity " + theirs + ")") +
      " as their prepare manifest records: the ids would mean other tokens; run `ztrain prepare "
      "--tokenizer " +
      mine.string() + "` on the text again, or train the model those tokens were made for");
}

// Rows that pack several examples need a model whose attention and
// positions take the examples' boundaries, on whole rows.
void check_segments(const RunConfig& config, const Run& run, const DataInfo& d) {
  if (!d.segments) return;
  const std::string packed = "the data packs several examples a row (" + d.description + ")";
  if (const std::string why = run.model->segments_refusal(); !why.empty())
    throw ConfigError(config.where("data.plugin") + ": " + packed + ", and " + why +
                      "; unpack the rows ([data] packing = false) or train such a model");
  const ParallelSettings& p = run.settings.parallel;
  if (p.split().shards() > 1)
    throw ConfigError(config.where("parallel." + p.split_key()) + ": [parallel] " + p.split_key() +
                      " = " + std::to_string(p.split_key() == "context" ? p.context : p.sequence) +
                      ": " + packed +
                      ", and attention split over ranks does not take example boundaries yet; "
                      "unpack the rows ([data] packing = false) or set it to 1");
}

DataInfo open_data(Run& run, const RunParts& parts) {
  std::string why;
  DataInfo info;
  try {
    run.data = parts.data_lib.create<DataSource>(parts.data_options);
    DataSetup setup;
    setup.seq_len = parts.info.seq_len;
    setup.vocab_size = parts.info.vocab_size;
    setup.seed = run.data_seed;
    setup.evaluates = run.settings.train.eval_every > 0;
    if (parts.model_options.has_value("init_from"))
      setup.model_dir = parts.model_options.get_string("init_from");
    static const TokenizedReader reader(text::host_sft_reader());
    setup.sft = &reader;
    run.data->setup(setup);
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

// Ranks sharing a host on cores of their own where job/core_share.h says
// so (a binding the kernel refuses is a warning: the rank runs unbound).
// Returns the rank's kernel threads: [device] threads, else the plan's.
int bind_cores(Run& run) {
  const DeviceSettings& dev = run.settings.device;
  const CoreBinding binding = dev.bind_cores == "on"    ? CoreBinding::on
                              : dev.bind_cores == "off" ? CoreBinding::off
                                                        : CoreBinding::automatic;
  const auto rank = static_cast<std::size_t>(run.comm->rank());
  const CoreShares shares = plan_core_shares(gather_rank_cpus(dev.threads, *run.comm), binding);
  run.cores = shares.text;
  const std::vector<int>& own = shares.cpus[rank];
  if (!own.empty())
    if (std::string why = bind_process(own); !why.empty())
      run.config_notes.push_back("warning: rank " + std::to_string(rank) + ": " + why +
                                 "; its threads run where the scheduler puts them");
  return dev.threads > 0 ? dev.threads : shares.threads[rank];
}

// The device, its kernels and, on a GPU, the nccl communicator the
// strategy's collectives run on (the launcher's carries its id and the
// trainer's own scalars). One GPU per rank: the rank's place among the
// ranks on its machine picks it.
void open_device(Run& run, int threads) {
  const DeviceSettings& dev = run.settings.device;
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
  // The model's GEMMs run on the cpu kernels only on a cpu device.
  if (run.device->kind() == DeviceKind::cpu)
    if (std::string w = blas::report().warning(); !w.empty()) run.config_notes.push_back(w);
}

// The mesh of [parallel] over the job's hosts; its groups (collective
// splits of the strategy's communicator) only when a dimension other than
// data needs one.
void open_mesh(Run& run, const std::vector<RankPlace>& places) {
  const ParallelSettings& p = run.settings.parallel;
  run.mesh = plan_mesh(p, mesh_hosts(places));
  if (p.model_ranks() > 1) run.mesh_groups = make_mesh_groups(run.mesh, run.strategy_comm());
}

// Builds every part of `run` but its communicator, which it holds already.
// The weights a run starts from besides a checkpoint's: [model]
// init_from's (every parameter; on a resume only the frozen ones, which a
// checkpoint does not hold), or on a resume without it the frozen
// parameters' values from the seed (a fresh run's setup drew them).
void load_weights(const RunParts& parts, Run& run, bool resumed, std::uint64_t seed) {
  if (!parts.model_options.has_value("init_from")) {
    if (resumed && parts.frozen) parts.frozen->draw_frozen(seed);
    return;
  }
  if (resumed && !parts.frozen) return;
  const fs::path path = parts.model_options.get_string("init_from");
  FrozenSplit* frozen = parts.frozen.get();
  Strategy& strategy = *run.strategy;
  const StateLoader load = [&](StateSource& s) {
    if (!resumed) strategy.load_state(s);
    if (frozen) frozen->load_frozen(s);
  };
  const ParamSpecs* whole = parts.whole_params.empty() ? nullptr : &parts.whole_params;
  const WeightsImport w = import_weights(*run.model, {load, seed, whole}, path, *run.comm);
  if (resumed) return;
  run.init_from = path;
  run.weights_import = w;
}

void assemble_run(Run& run, const RunConfig& config, const PluginLoader& loader) {
  run.resolved = resolve_config(config, loader);
  run.config_notes = config.notes();
  RunParts parts =
      make_run_parts(config, loader, {run.comm->size(), local_rank_count(), run.comm->rank()});
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
  run.pipeline_bounds = parts.pipeline_bounds;
  run.whole_params = parts.whole_params;
  run.pipeline_plan = parts.pipeline_plan;

  open_device(run, bind_cores(run));
  const bool cuda = run.settings.device.kind == "cuda";
  const std::vector<RankPlace> places = gather_places(cuda, *run.comm);
  if (run.comm->size() > 1 || cuda || std::getenv("CUDA_VISIBLE_DEVICES"))
    run.placement = placement_text(places, cuda);
  try {
    open_mesh(run, places);
  } catch (const ConfigError& e) {
    throw ConfigError(config.where("parallel." + run.settings.parallel.split_key()) + ": " +
                      e.what());
  }

  const ModelInfo& info = parts.info;
  const DataInfo dinfo = open_data(run, parts);
  run.config_notes.insert(run.config_notes.end(), dinfo.notes.begin(), dinfo.notes.end());
  check_segments(config, run, dinfo);
  if (run.settings.train.epochs > 0)
    run.config_notes.push_back(steps_from_epochs(run.settings, config, dinfo.train_sequences));
  for (auto& w : schedule_warnings(run.settings.train.schedule, run.settings.train.steps))
    run.config_notes.push_back("warning: " + w);
  check_tokenizers_agree(config, parts, dinfo);
  if (dinfo.vocab_used > info.vocab_size)
    throw ConfigError(config.where("model.vocab_size") + ": [model] vocab_size " +
                      std::to_string(info.vocab_size) + " is smaller than the " +
                      std::to_string(dinfo.vocab_used) + " token ids the data produces (" +
                      dinfo.description + "); raise vocab_size");
  if (run.settings.train.sample.every > 0 && dinfo.tokenizer.empty())
    throw ConfigError(config.where("train.sample_every") +
                      ": [train] sample_every needs the data's tokenizer to turn ids into text, "
                      "and the data here (" +
                      dinfo.description +
                      ") names none: make the tokens with `ztrain prepare` (its manifest names "
                      "the tokenizer), or set sample_every = 0");

  const auto& tr = run.settings.train;
  run.sizes = parts.sizes;
  const EstimateArgs& sizes = run.sizes;
  MemoryEstimate states = run.strategy->estimate(sizes);
  states.bytes[Tier::host][Category::activations] += sizes.host_activation_bytes;
  if (std::string warning =
          check_memory_fits(config, states, run.device->host_visible(Tier::device),
                            sizes.activation_bytes, static_cast<int>(tr.micro_batch), info.seq_len,
                            info.n_params, local_rank_count(), *run.comm);
      !warning.empty())
    run.config_notes.push_back(std::move(warning));
  StrategySetup setup;
  setup.params = sizes.params;
  setup.modules = run.model->modules();
  setup.device = run.device.get();
  // The strategy averages over the ranks holding the same parts: all of
  // them but under tensor and pipeline parallelism, whose parts it must
  // not mix.
  const ParallelSettings& par = run.settings.parallel;
  setup.comm =
      par.tensor > 1 || par.pipeline > 1 ? &run.mesh_groups->same_part() : &run.strategy_comm();
  setup.kernels = run.kernels.get();
  setup.host_kernels = run.host_kernels ? run.host_kernels.get() : run.kernels.get();
  setup.optimizer = tr.optimizer;
  setup.precision = sizes.precision;
  setup.grad_dtype = sizes.grad_dtype;
  setup.seed = tr.seed;
  setup.draw_initial_values = tr.resume.empty() && !parts.model_options.has_value("init_from");
  setup.activation_bytes = sizes.activation_bytes;
  setup.device_budget = sizes.device_budget;
  setup.host_budget = sizes.host_budget;
  run.strategy->setup(setup);
  const bool resumed = !tr.resume.empty();
  if (resumed)
    run.resumed = resume_from({tr.resume, tr.out_dir, setup.params, run.resolved.keys,
                               tr.global_batch, tr.steps, run.whole_params},
                              *run.strategy, *run.comm);
  load_weights(parts, run, resumed, tr.seed);
  if (!resumed && parts.model_options.has_value("adapter_from")) {
    const std::string dir = parts.model_options.get_string("adapter_from");
    import_adapter(*run.model, *run.strategy, dir, parts.model_options.where("adapter_from"),
                   *run.comm);
    run.config_notes.push_back("adapters from " + dir);
  }
}

// One rank's bytes: what the strategy holds of the parts' parameters,
// and the activations.
MemoryEstimate rank_estimate(const RunParts& parts) {
  MemoryEstimate e = parts.strategy->estimate(parts.sizes);
  e.bytes[Tier::device][Category::activations] += parts.sizes.activation_bytes;
  e.bytes[Tier::host][Category::activations] += parts.sizes.host_activation_bytes;
  return e;
}

void estimate_run(const TrainArgs& args, int world, std::ostream& os) {
  const RunConfig config = load_run_config(args);
  const PluginLoader loader = command_line_loader(args.plugin_paths, args.verbose);
  const RunParts parts = make_run_parts(config, loader, {world, world, 0});
  MemoryEstimate e = rank_estimate(parts);
  // Under pipeline parallelism each category is its worst stage's, as a
  // run's measured peaks are its worst rank's.
  const int stages = parts.settings.parallel.pipeline;
  for (int stage = 1; stage < stages; ++stage) {
    const MemoryEstimate other =
        rank_estimate(make_run_parts(config, loader, {world, world, stage * (world / stages)}));
    for (Tier t : kTiers)
      for (Category c : kCategories) e.bytes[t][c] = std::max(e.bytes[t][c], other.bytes[t][c]);
  }
  const RunSettings& settings = parts.settings;
  const ModelInfo& info = parts.info;
  const std::string& model_name = parts.model_plugin;
  const std::string& strategy_name = parts.strategy_plugin;
  os << "estimate: strategy " << strategy_name << ", " << world << " rank" << (world > 1 ? "s" : "")
     << ", model " << model_name << " (" << info.arch << ", " << info.n_params
     << " params), micro-batch " << settings.train.micro_batch << " x " << info.seq_len
     << " tokens, " << precision_label(settings.train.precision) << " weights and "
     << precision_label(settings.train.grad_dtype) << " gradients"
     << (settings.train.precision != DType::f32 ? " (fp32 master weights in optimizer)" : "")
     << "\n";
  if (!e.note.empty()) os << strategy_name << ": " << e.note << "\n";
  // The mesh as one host would lay it out: the bytes are one rank's of it.
  if (settings.parallel.model_ranks() > 1)
    os << "mesh: " << plan_mesh(settings.parallel, MeshHosts{{world}}).describe()
       << " (the bytes below are one rank's: its tensor parts, its share of each sequence"
       << (stages > 1 ? ", each category its worst pipeline stage's" : "") << ")\n";
  os << "peak bytes per rank:\n";
  for (Tier t : kTiers) {
    std::uint64_t total = 0;
    for (Category c : kCategories) {
      const std::uint64_t b = e.bytes[t][c];
      if (!b) continue;
      total += b;
      char line[128];
      std::snprintf(line, sizeof line, "  %-7s %-12s %14llu  %s\n",
                    std::string(tier_name(t)).c_str(), std::string(category_name(c)).c_str(),
                    static_cast<unsigned long long>(b), format_bytes(b).c_str());
      os << line;
    }
    if (total) {
      char line[128];
      std::snprintf(line, sizeof line, "  %-7s %-12s %14llu  %s\n",
                    std::string(tier_name(t)).c_str(), "total",
                    static_cast<unsigned long long>(total), format_bytes(total).c_str());
      os << line;
    }
  }
  os << "(each category's peak; they need not coincide, so a tier's total is an upper bound)\n";
}

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

void estimate(const TrainArgs& args, int world, std::ostream& os) {
  try {
    estimate_run(args, world, os);
  } catch (...) {
    rethrow_detached();
  }
}

namespace {

// --llamafactory: the YAML's run, then --strategy and --set as on a run
// file; the YAML's deepspeed key is read as --deepspeed would be.
RunConfig llamafactory_run(TrainArgs& args) {
  if (!args.model.empty())
    throw ConfigError("--llamafactory " + args.llamafactory.string() +
                      " names the model (model_name_or_path); drop --model " + args.model);
  const LlamaFactoryImport lf = import_llamafactory(args.llamafactory);
  RunConfig config = RunConfig::parse("", args.llamafactory.string());
  for (const auto& [section, table] : {std::pair{"model", &lf.run.model},
                                       {"data", &lf.run.data},
                                       {"train", &lf.run.train},
                                       {"comm", &lf.run.comm}})
    config.set_imported(section, *table, false, lf.run.origins);
  for (const auto& n : lf.run.notes) config.add_note(n);
  if (!lf.deepspeed.empty()) {
    if (!args.deepspeed.empty())
      throw ConfigError(lf.deepspeed_where + " and --deepspeed " + args.deepspeed.string() +
                        " both give the DeepSpeed config; give one");
    args.deepspeed = lf.deepspeed;
  }
  std::vector<fs::path> presets;
  for (const fs::path& root : config_roots(args.llamafactory))
    presets.push_back(root / "strategies");
  if (!args.strategy.empty() && args.deepspeed.empty())
    config.select_strategy(args.strategy, presets);
  for (const auto& o : args.overrides) config.override_with(o);
  return config;
}

}  // namespace

RunConfig load_run_config(const TrainArgs& given) {
  TrainArgs args = given;
  RunConfig config = args.llamafactory.empty()
                         ? RunConfig::load(args.config, args.model, args.strategy, args.overrides,
                                           config_roots(args.config))
                         : llamafactory_run(args);
  resolve_model_dir(config);
  resume_shorthand(config);
  if (args.deepspeed.empty() && args.accelerate.empty()) {
    inherit_resumed_run(config);
    return config;
  }
  const std::string flag = !args.deepspeed.empty()
                               ? "--deepspeed " + args.deepspeed.string()
                               : "--accelerate-config " + args.accelerate.string();
  if (!args.deepspeed.empty() && !args.accelerate.empty())
    throw ConfigError(
        "--deepspeed and --accelerate-config both give the strategy; give one (an "
        "Accelerate file names its DeepSpeed config in deepspeed_config_file)");
  if (!args.strategy.empty())
    throw ConfigError(flag + " gives the strategy; drop --strategy " + args.strategy);
  const ImportedConfig imported = !args.deepspeed.empty()
                                      ? import_deepspeed(args.deepspeed, config)
                                      : import_accelerate(args.accelerate, config);
  for (const auto& key : imported.superseded) config.drop(key);
  config.set_imported("strategy", imported.strategy, true, imported.origins);
  config.set_imported("train", imported.train, false, imported.origins);
  if (!imported.device.empty())
    config.set_imported("device", imported.device, false, imported.origins);
  if (!imported.model.empty())
    config.set_imported("model", imported.model, false, imported.origins);
  if (!imported.parallel.empty())
    config.set_imported("parallel", imported.parallel, false, imported.origins);
  // --set wins again, except over a key the import dropped after an "auto"
  // read it: its value is already in the import.
  for (const auto& o : args.overrides) {
    const std::string key = o.substr(0, o.find('='));
    const auto dropped = [&](const std::vector<std::string>& v) {
      return std::find(v.begin(), v.end(), key) != v.end();
    };
    if (!(dropped(imported.superseded) && dropped(imported.consumed))) config.override_with(o);
  }
  resume_shorthand(config);
  inherit_resumed_run(config);
  for (const auto& n : imported.notes) config.add_note(n);
  for (const auto& w : imported.warnings) config.add_note("warning: " + w);
  return config;
}

Run assemble(std::unique_ptr<Communicator> comm, const RunConfig& config,
             const PluginLoader& loader) {
  Run run;
  run.comm = std::move(comm);
  try {
    assemble_run(run, config, loader);
    return run;
  } catch (const std::exception& e) {
    // Before the parts unwind: the other ranks may wait in a collective of
    // the assembly this rank will not reach.
    run.comm->announce_failure(e.what());
    rethrow_detached();
  } catch (...) {
    rethrow_detached();
  }
}

Run assemble(const RunConfig& config, const PluginLoader& loader) {
  return assemble(make_communicator(resolve_comm(config)), config, loader);
}

void check_run(const TrainArgs& args, int world) {
  const RunConfig config = load_run_config(args);
  const PluginLoader loader = command_line_loader(args.plugin_paths, args.verbose);
  resolve_config(config, loader);
  make_run_parts(config, loader, {world, world, 0});
}

std::string resolved_config_of(const TrainArgs& args) {
  const RunConfig config = load_run_config(args);
  return resolve_config(config, command_line_loader(args.plugin_paths, args.verbose)).toml;
}

}  // namespace ztrain
