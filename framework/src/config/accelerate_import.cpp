#include "config/accelerate_import.h"

#include <yaml-cpp/yaml.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "config/yaml_mapping.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

using nlohmann::json;

// DEEPSPEED without deepspeed_config_file: the DeepSpeed config Accelerate's
// DeepSpeedPlugin makes from deepspeed_config, batch and precision "auto"
// (the run's, as Accelerate fills them from the script).
json deepspeed_of(YamlMapping& ds) {
  const std::int64_t stage = ds.integer("zero_stage", 2);
  if (stage < 0 || stage > 3)
    throw ConfigError(ds.where("zero_stage") + " is " + std::to_string(stage) + "; give 0 to 3");
  json zero = {{"stage", stage}};
  for (const char* part : {"optimizer", "param"}) {
    const std::string key = std::string("offload_") + part + "_device";
    const std::string device = ds.text(key, "none");
    const bool param = part == std::string("param");
    if (device != "none" && device != "cpu" && device != "nvme")
      throw ConfigError(ds.where(key) + " is \"" + device + "\"; expected none, cpu or nvme");
    if (device != "none" && (stage == 0 || ((param || device == "nvme") && stage != 3)))
      throw ConfigError(ds.where(key) + " is \"" + device + "\" but " + ds.where("zero_stage") +
                        " is " + std::to_string(stage) +
                        (stage == 0 ? "; offloading needs a ZeRO stage"
                                    : "; parameters and NVMe are offloaded at stage 3 only"));
    zero[std::string("offload_") + part] = {{"device", device}};
    const std::string nvme = std::string("offload_") + part + "_nvme_path";
    if (ds.get(nvme)) zero[std::string("offload_") + part]["nvme_path"] = ds.text(nvme, "");
  }
  json cfg = {{"zero_optimization", zero},
              {"train_micro_batch_size_per_gpu", "auto"},
              {"train_batch_size", "auto"}};
  if (const YAML::Node n = ds.get("gradient_accumulation_steps"))
    cfg["gradient_accumulation_steps"] = ds.integer("gradient_accumulation_steps", 1);
  if (ds.get("gradient_clipping")) cfg["gradient_clipping"] = ds.number("gradient_clipping", 1.0);
  return cfg;
}

// FSDP's sharding onto a strategy: FULL_SHARD is ZeRO-3, SHARD_GRAD_OP
// ZeRO-2, NO_SHARD ddp; the HYBRID ones shard within a machine and
// replicate across machines, so on one machine they are FULL_SHARD and
// SHARD_GRAD_OP. FSDP 2 says it with reshard_after_forward (true: FULL_SHARD).
std::string fsdp_sharding(YamlMapping& f) {
  const std::int64_t version = f.integer("fsdp_version", 1);
  if (version == 2) {
    if (f.get("fsdp_sharding_strategy"))
      throw ConfigError(f.where("fsdp_sharding_strategy") +
                        " is FSDP 1's; FSDP 2 says it with fsdp_reshard_after_forward");
    return f.flag("fsdp_reshard_after_forward", true) ? "FULL_SHARD" : "SHARD_GRAD_OP";
  }
  f.get("fsdp_reshard_after_forward");
  static const char* const by_number[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                          "HYBRID_SHARD_ZERO2"};
  std::string name = f.text("fsdp_sharding_strategy", "FULL_SHARD");
  if (name.size() == 1 && name[0] >= '1' && name[0] <= '5') name = by_number[name[0] - '1'];
  if (name == "HYBRID_SHARD") return "FULL_SHARD";
  if (name == "HYBRID_SHARD_ZERO2") return "SHARD_GRAD_OP";
  if (name != "FULL_SHARD" && name != "SHARD_GRAD_OP" && name != "NO_SHARD")
    throw ConfigError(f.where("fsdp_sharding_strategy") + " is \"" + name +
                      "\"; expected FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or "
                      "HYBRID_SHARD_ZERO2");
  return name;
}

void map_fsdp(YamlMapping& f, ImportedConfig& out) {
  const std::string sharding = fsdp_sharding(f);
  const bool offload = f.flag("fsdp_offload_params", false);
  const std::string where = f.where(f.integer("fsdp_version", 1) == 2 ? "fsdp_reshard_after_forward"
                                                                      : "fsdp_sharding_strategy");
  std::string plugin = sharding == "FULL_SHARD"      ? "zero3"
                       : sharding == "SHARD_GRAD_OP" ? "zero2"
                                                     : "ddp";
  if (offload) {
    if (plugin == "ddp")
      throw ConfigError(f.where("fsdp_offload_params") +
                        " is true with NO_SHARD; ztrain offloads sharded state only (ZeRO 1-3)");
    // FSDP's CPU offload keeps parameters, gradients and the optimizer's
    // step on the host.
    out.strategy.insert_or_assign("stage", plugin == "zero3" ? 3 : 2);
    out.strategy.insert_or_assign("offload_optimizer", toml::table{{"device", "cpu"}});
    if (plugin == "zero3")
      out.strategy.insert_or_assign("offload_param", toml::table{{"device", "cpu"}});
    plugin = "cpu_offload";
  }
  out.strategy.insert_or_assign("plugin", plugin);
  out.origins["strategy.plugin"] = where;
  out.notes.push_back(where + ": " + sharding + (offload ? " with CPU offload" : "") + " -> " +
                      plugin);
  if (f.flag("fsdp_activation_checkpointing", false)) {
    out.model.insert_or_assign("activation_checkpointing", true);
    out.origins["model.activation_checkpointing"] = f.where("fsdp_activation_checkpointing");
  }
  f.no_effect(
      {{"fsdp_auto_wrap_policy", "ztrain gathers by the model's modules"},
       {"fsdp_transformer_layer_cls_to_wrap", "ztrain gathers by the model's modules"},
       {"fsdp_min_num_params", "ztrain gathers by the model's modules"},
       {"fsdp_backward_prefetch", "ztrain prefetches by its gather plan"},
       {"fsdp_backward_prefetch_policy", "ztrain prefetches by its gather plan"},
       {"fsdp_forward_prefetch", "ztrain prefetches by its gather plan"},
       {"fsdp_state_dict_type", "ztrain writes consolidated weights and its own checkpoints"},
       {"fsdp_sync_module_states", "every rank starts from the same weights anyway"},
       {"fsdp_use_orig_params", "no flattened-parameter views to keep"},
       {"fsdp_cpu_ram_efficient_loading", "rank 0 reads the weights and sends them"}},
      out.warnings);
  f.finish();
}

// The run's precision from mixed_precision.
std::string precision_of(YamlMapping& top) {
  const std::string mp = top.text("mixed_precision", "no");
  if (mp == "no") return "fp32";
  if (mp == "fp16" || mp == "bf16") return mp;
  throw ConfigError(top.where("mixed_precision") + " is \"" + mp +
                    "\"; ztrain trains in fp32, bf16 or fp16 (\"no\", \"bf16\", \"fp16\")");
}

void map_precision(YamlMapping& top, ImportedConfig& out) {
  out.train.insert_or_assign("precision", precision_of(top));
  out.origins["train.precision"] = top.where("mixed_precision");
}

// An integer key within [lo, hi], or fallback when absent.
int bounded(YamlMapping& m, const std::string& key, int fallback, int lo, int hi,
            const std::string& what) {
  const std::int64_t v = m.integer(key, fallback);
  if (v < lo || v > hi) throw ConfigError(m.where(key) + " is " + std::to_string(v) + "; " + what);
  return static_cast<int>(v);
}

// Accelerate's ParallelismConfig (`parallelism_config`): the context
// degree onto [parallel] context (torch's context parallelism: ring
// attention over load-balanced chunks; allgather or alltoall is how torch
// moves the keys, not what is computed), DeepSpeed's sequence degree onto
// sequence, the tensor degree onto tensor (which the run refuses naming
// this key while tensor parallelism is not built). The data degrees
// (replicated and sharded) are what ztrain derives, the world over the
// others: the strategy shards over every data rank, replicas or not, which
// trains the same; their product with the others must be num_processes,
// as Accelerate checks.
void map_parallelism(YamlMapping& p, int processes, ImportedConfig& out) {
  const auto degree = [&](const char* key) {
    return bounded(p, key, 1, 1, 65536, "give a degree of 1 or more");
  };
  const int replicate = degree("parallelism_config_dp_replicate_size"),
            shard = degree("parallelism_config_dp_shard_size"),
            tp = degree("parallelism_config_tp_size"), cp = degree("parallelism_config_cp_size"),
            sp = degree("parallelism_config_sp_size");
  const long long ranks = 1LL * replicate * shard * tp * cp * sp;
  if (ranks != processes)
    throw ConfigError(p.where("parallelism_config_dp_shard_size") + ": dp_replicate " +
                      std::to_string(replicate) + " x dp_shard " + std::to_string(shard) +
                      " x tp " + std::to_string(tp) + " x cp " + std::to_string(cp) + " x sp " +
                      std::to_string(sp) + " = " + std::to_string(ranks) +
                      " ranks, but num_processes is " + std::to_string(processes) +
                      "; Accelerate refuses this too: make the product the number of processes");
  for (const auto& [key, degree_of, onto] :
       {std::tuple{"parallelism_config_cp_size", cp, "context"},
        {"parallelism_config_sp_size", sp, "sequence"},
        {"parallelism_config_tp_size", tp, "tensor"}})
    if (degree_of > 1) {
      out.parallel.insert_or_assign(onto, degree_of);
      out.origins[std::string("parallel.") + onto] = p.where(key);
    }
  if (replicate > 1 && shard > 1)
    out.warnings.push_back(p.where("parallelism_config_dp_replicate_size") +
                           ": ztrain's strategy shards over all " +
                           std::to_string(replicate * shard) +
                           " data ranks rather than keeping replicas of shards (HSDP): the same "
                           "training, each rank holding less");
  if (const std::string backend = p.text("parallelism_config_sp_backend", "deepspeed");
      backend != "deepspeed")
    throw ConfigError(p.where("parallelism_config_sp_backend") + " is \"" + backend +
                      "\"; ztrain's sequence parallelism is DeepSpeed's (Ulysses): write "
                      "\"deepspeed\" or remove it");
  if (const std::string backend = p.text("parallelism_config_cp_backend", "torch");
      backend != "torch")
    throw ConfigError(p.where("parallelism_config_cp_backend") + " is \"" + backend +
                      "\"; ztrain's context parallelism is ring attention as torch's: write "
                      "\"torch\" or remove it");
  p.no_effect(
      {{"parallelism_config_cp_comm_strategy",
        "ztrain's ring passes each rank's keys and values to the next (the same attention)"},
       {"parallelism_config_sp_seq_length", "the sequence length is [model] seq_len"},
       {"parallelism_config_sp_seq_length_is_variable", "every sequence is seq_len tokens"},
       {"parallelism_config_sp_attn_implementation", "ztrain runs its own attention kernels"}},
      out.warnings);
  p.finish();
}

// DEEPSPEED's multi-machine launch from machine 0 (pdsh and the MPI
// launchers): the hostfile, one filter (the exclusion wins, as accelerate
// launch passes only it), every machine's ranks started from here.
void deepspeed_hostfile_launch(YamlMapping& top, YamlMapping& ds, const std::string& launcher,
                               AccelerateLaunch& l, std::vector<std::string>& warnings) {
  if (l.machine_rank != 0)
    throw ConfigError(top.where("machine_rank") + " is " + std::to_string(l.machine_rank) +
                      ": with deepspeed_multinode_launcher \"" + launcher +
                      "\" machine 0 starts every machine's ranks; run ztrain on machine 0 only");
  l.hostfile = ds.text("deepspeed_hostfile", "");
  if (l.hostfile.empty())
    throw ConfigError(ds.where("deepspeed_hostfile") + " is missing; with num_machines " +
                      std::to_string(l.machines) + " and deepspeed_multinode_launcher \"" +
                      launcher + "\" it names the machines and their GPU slots");
  l.exclude = ds.text("deepspeed_exclusion_filter", "");
  l.include = ds.text("deepspeed_inclusion_filter", "");
  if (!l.exclude.empty() && !l.include.empty()) {
    warnings.push_back(ds.where("deepspeed_inclusion_filter") +
                       " has no effect: accelerate launch passes only the exclusion filter");
    l.include.clear();
  }
  top.text("main_process_ip", "");  // --master_addr: MPI ranks meet without it
  top.no_effect({{"rdzv_backend", "mpirun starts and connects the hostfile's ranks"}}, warnings);
  warnings.push_back(ds.where("deepspeed_multinode_launcher") + " is \"" + launcher +
                     "\": ztrain starts the hostfile's ranks through mpirun over ssh, as its "
                     "--hostfile does");
}

// torchrun's launch, as accelerate launch runs it on each machine: this
// machine's ranks, meeting the others at main_process_ip:main_process_port.
void per_machine_launch(YamlMapping& top, YamlMapping* ds, AccelerateLaunch& l,
                        std::vector<std::string>& warnings) {
  l.main_ip = top.text("main_process_ip", "");
  if (l.main_ip.empty())
    throw ConfigError(top.where("main_process_ip") + " is missing; with num_machines " +
                      std::to_string(l.machines) +
                      " the machines meet at machine 0's address: give it");
  top.no_effect({{"rdzv_backend",
                  "the machines meet at main_process_ip:main_process_port, each with the "
                  "machine_rank its file gives (torchrun's static rendezvous)"}},
                warnings);
  if (ds)
    ds->no_effect(
        {{"deepspeed_hostfile", "the standard launcher starts each machine's ranks there"},
         {"deepspeed_inclusion_filter", "the standard launcher starts each machine's ranks there"},
         {"deepspeed_exclusion_filter", "the standard launcher starts each machine's ranks there"}},
        warnings);
}

// The machines and ranks of the launch. ds: the deepspeed_config mapping
// under DEEPSPEED (its multi-machine launcher keys), else null.
AccelerateLaunch machines_of(YamlMapping& top, YamlMapping* ds,
                             std::vector<std::string>& warnings) {
  if (top.text("compute_environment", "LOCAL_MACHINE") != "LOCAL_MACHINE")
    throw ConfigError(top.where("compute_environment") +
                      " is not LOCAL_MACHINE; ztrain starts jobs on the machines it runs on");
  AccelerateLaunch l;
  l.machines = bounded(top, "num_machines", 1, 1, 65536, "give 1 or more machines");
  l.machine_rank =
      bounded(top, "machine_rank", 0, 0, l.machines - 1,
              "it must be 0 to num_machines - 1 (" + std::to_string(l.machines - 1) + ")");
  if (const std::string ids = top.text("gpu_ids", "all"); ids != "all")
    throw ConfigError(top.where("gpu_ids") + " is \"" + ids +
                      "\"; choose GPUs with --hostfile and --include localhost:0,1 (their ids "
                      "become CUDA_VISIBLE_DEVICES), or set gpu_ids: all");
  l.main_port = bounded(top, "main_process_port", 29500, 1, 65535, "give a TCP port");
  const std::string launcher = ds ? ds->text("deepspeed_multinode_launcher", "pdsh") : "standard";
  if (l.machines == 1) {
    top.no_effect({{"main_process_ip", "one machine: the ranks meet locally"},
                   {"main_process_port", "one machine: the ranks meet locally"},
                   {"rdzv_backend", "one machine: the ranks meet locally"}},
                  warnings);
    if (ds)
      ds->no_effect(
          {{"deepspeed_multinode_launcher", "one machine: there is no other node to reach"},
           {"deepspeed_hostfile", "one machine: there is no other node to reach"},
           {"deepspeed_inclusion_filter", "one machine: there is no other node to reach"},
           {"deepspeed_exclusion_filter", "one machine: there is no other node to reach"}},
          warnings);
  } else if (launcher == "standard") {
    per_machine_launch(top, ds, l, warnings);
  } else if (launcher == "pdsh" || launcher == "openmpi" || launcher == "mvapich" ||
             launcher == "mpich" || launcher == "impi" || launcher == "slurm") {
    deepspeed_hostfile_launch(top, *ds, launcher, l, warnings);
  } else {
    throw ConfigError(ds->where("deepspeed_multinode_launcher") + " is \"" + launcher +
                      "\"; ztrain starts machines as \"standard\" (each machine its own "
                      "ranks) or from machine 0 through deepspeed_hostfile (pdsh, openmpi, "
                      "mvapich, mpich, impi, slurm)");
  }
  top.no_effect(
      {{"same_network", "the ranks reach each other at the addresses they are given"},
       {"main_training_function", "ztrain's training loop is its own"},
       {"enable_cpu_affinity", "ztrain binds ranks to cores itself ([device] bind_cores)"},
       {"debug", "ztrain's own checks always run"},
       {"dynamo_config", "ztrain's kernels are compiled already"},
       {"downcast_bf16", "a TPU setting"},
       {"tpu_env", "a TPU setting"},
       {"tpu_use_cluster", "a TPU setting"},
       {"tpu_use_sudo", "a TPU setting"}},
      warnings);
  return l;
}

}  // namespace

// The distributed types ztrain runs.
void check_type(YamlMapping& top) {
  const std::string type = top.text("distributed_type", "NO");
  if (type != "NO" && type != "MULTI_CPU" && type != "MULTI_GPU" && type != "DEEPSPEED" &&
      type != "FSDP")
    throw ConfigError(top.where("distributed_type") + " is \"" + type +
                      "\"; ztrain runs NO, MULTI_CPU, MULTI_GPU, DEEPSPEED and FSDP");
}

AccelerateLaunch accelerate_launch(const std::filesystem::path& yaml_file) {
  // What would refuse the run is refused before any rank starts.
  YamlMapping top(load_yaml(yaml_file, "Accelerate config"), "", yaml_file.filename().string(),
                  "Accelerate config");
  if (!top.get("distributed_type"))
    throw ConfigError(top.where("distributed_type") +
                      " is missing; Accelerate requires it (NO, MULTI_CPU, MULTI_GPU, DEEPSPEED "
                      "or FSDP)");
  check_type(top);
  const std::string type = top.text("distributed_type", "NO");
  YamlMapping ds = top.sub("deepspeed_config");
  std::vector<std::string> warnings;
  AccelerateLaunch l = machines_of(top, type == "DEEPSPEED" ? &ds : nullptr, warnings);
  precision_of(top);
  if (type == "NO") return l;
  if (!top.get("num_processes"))
    throw ConfigError(top.where("num_processes") + " is missing; accelerate launch needs it for " +
                      type);
  l.processes = bounded(top, "num_processes", 1, 1, 65536, "give the number of ranks to start");
  if (l.processes % l.machines != 0)
    throw ConfigError(top.where("num_processes") + " is " + std::to_string(l.processes) + " on " +
                      std::to_string(l.machines) +
                      " machines; every machine starts the same number of ranks: give a "
                      "multiple of num_machines");
  return l;
}

ImportedConfig import_accelerate(const std::filesystem::path& yaml_file, const RunConfig& run) {
  const std::string name = yaml_file.filename().string();
  YamlMapping top(load_yaml(yaml_file, "Accelerate config"), "", name, "Accelerate config");
  ImportedConfig out;
  const std::string type = top.text("distributed_type", "NO");
  const bool cpu = top.flag("use_cpu", false);
  YamlMapping ds = top.sub("deepspeed_config"), f = top.sub("fsdp_config");
  std::vector<std::string> machine_warnings;
  machines_of(top, type == "DEEPSPEED" ? &ds : nullptr, machine_warnings);
  const int processes = bounded(top, "num_processes", 1, 1, 65536, "give the number of ranks");
  if (type == "DEEPSPEED") {
    std::vector<std::string> quiet;
    ds.no_effect({{"zero3_init_flag", "parameters are created sharded anyway"},
                  {"zero3_save_16bit_model", "ztrain always writes consolidated weights"}},
                 quiet);
    const std::string file = ds.text("deepspeed_config_file", "");
    if (!file.empty()) {
      // The DeepSpeed file decides the precision: Accelerate refuses a
      // mixed_precision beside it, and so does ztrain.
      if (top.text("mixed_precision", "no") != "no")
        throw ConfigError(top.where("mixed_precision") +
                          " beside deepspeed_config_file: Accelerate refuses both; give the "
                          "precision in the DeepSpeed file");
      out = import_deepspeed(file, run);
      // Its "auto" precision is Accelerate's default, "no".
      if (!out.train.contains("precision")) {
        out.train.insert_or_assign("precision", "fp32");
        out.origins["train.precision"] = top.where("mixed_precision") + " (absent: no)";
      }
      for (const char* key : {"zero_stage", "offload_optimizer_device", "offload_param_device",
                              "gradient_accumulation_steps", "gradient_clipping"})
        if (ds.get(key))
          throw ConfigError(ds.where(key) +
                            " beside deepspeed_config_file: Accelerate refuses "
                            "both; give it in the DeepSpeed file");
    } else {
      // The DeepSpeed config Accelerate builds fills its "auto" from the
      // run, with this file's precision.
      RunConfig with_precision = run;
      with_precision.set_imported("train", toml::table{{"precision", precision_of(top)}}, false,
                                  {{"train.precision", top.where("mixed_precision")}});
      out = import_deepspeed_text(deepspeed_of(ds).dump(), name + " deepspeed_config",
                                  with_precision);
    }
    out.warnings.insert(out.warnings.end(), quiet.begin(), quiet.end());
    ds.finish();
  } else if (type == "FSDP") {
    map_fsdp(f, out);
  } else if (type == "NO" || type == "MULTI_CPU" || type == "MULTI_GPU") {
    out.strategy.insert_or_assign("plugin", "ddp");
    out.origins["strategy.plugin"] = top.where("distributed_type");
  } else {
    check_type(top);
  }
  for (const char* key : {"deepspeed_config", "fsdp_config"})
    if (const YAML::Node v = top.get(key);
        v && v.size() > 0 && type != (key == std::string("fsdp_config") ? "FSDP" : "DEEPSPEED"))
      out.warnings.push_back(top.where(key) + " has no effect: distributed_type is " + type);
  if (type != "DEEPSPEED" || ds.text("deepspeed_config_file", "").empty()) map_precision(top, out);
  out.warnings.insert(out.warnings.begin(), machine_warnings.begin(), machine_warnings.end());
  // NO runs one process where Accelerate would (a GPU if there is one);
  // the MULTI_* and sharded types on GPUs unless use_cpu.
  const std::string kind = cpu || type == "MULTI_CPU" ? "cpu" : type == "NO" ? "auto" : "cuda";
  out.device.insert_or_assign("kind", kind);
  out.origins["device.kind"] = top.where(cpu ? "use_cpu" : "distributed_type");
  // IPEX speeds up PyTorch's CPU kernels; ztrain runs its own, so
  // `accelerate config`'s `ipex: false` (and a true one) change nothing. An
  // Intel XPU is not a device ztrain runs on.
  YamlMapping ipex = top.sub("ipex_config");
  ipex.no_effect({{"ipex", "ztrain's CPU kernels are its own (IPEX speeds up PyTorch's)"}},
                 out.warnings);
  if (ipex.flag("use_xpu", false))
    throw ConfigError(ipex.where("use_xpu") +
                      " is true; ztrain runs on CPUs and NVIDIA GPUs, not Intel XPUs: set it to "
                      "false");
  ipex.finish();
  if (const YAML::Node v = top.get("parallelism_config"); v && v.size() > 0) {
    YamlMapping parallelism = top.sub("parallelism_config");
    map_parallelism(parallelism, processes, out);
  }
  for (const char* key : {"fp8_config", "megatron_lm_config", "mpirun_config"})
    if (const YAML::Node v = top.get(key); v && v.size() > 0)
      throw ConfigError(top.where(key) + " is set; ztrain has no " + key);
  top.finish();
  return out;
}

}  // namespace ztrain
