#include "commands/estimate_table.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "loader/plugin_loader.h"
#include "train/run_parts.h"
#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain {
namespace fs = std::filesystem;
namespace {

// The strategy presets, first those of the root nearest the run file;
// ddp and the ZeRO stages first, the rest by name.
std::vector<fs::path> strategy_presets(const fs::path& run_file) {
  std::vector<fs::path> found;
  std::vector<std::string> names;
  for (const fs::path& root : config_roots(run_file)) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root / "strategies", ec)) {
      const std::string name = e.path().stem().string();
      if (e.path().extension() != ".toml" ||
          std::find(names.begin(), names.end(), name) != names.end())
        continue;
      names.push_back(name);
      found.push_back(e.path());
    }
  }
  const auto rank = [](const fs::path& p) {
    static const std::vector<std::string> first = {"ddp", "zero1", "zero2", "zero3"};
    const auto at = std::find(first.begin(), first.end(), p.stem().string());
    return std::make_pair(at - first.begin(), p.stem().string());
  };
  std::sort(found.begin(), found.end(),
            [&](const fs::path& a, const fs::path& b) { return rank(a) < rank(b); });
  return found;
}

// A rank's activations with each way of splitting its sequences: the
// degree, by Ulysses ([parallel] sequence) or the ring (context), with
// activation checkpointing off and on.
struct Activations {
  int degree = 1;
  bool ring = false;
  std::uint64_t off = 0, on = 0;
  // "4", or "ctx 8" for the ring.
  std::string label() const { return (ring ? "ctx " : "") + std::to_string(degree); }
};

struct Sized {
  std::string strategy;
  std::string refused;    // why the preset cannot run this model as set; empty: it can
  MemoryEstimate states;  // per rank, activations not included
  std::uint64_t activations_off = 0, activations_on = 0;  // at the run's own sequence degree
  std::uint64_t host_activations = 0;    // offloaded checkpoints, with checkpointing on
  std::vector<Activations> by_sequence;  // every split the world and the model take
  std::int64_t n_params = 0;
  std::string model;
};

// The run of `preset` with `overrides` on top of the user's.
RunParts parts_of(const SizingArgs& a, const fs::path& preset, const PluginLoader& loader,
                  const std::vector<std::string>& overrides) {
  TrainArgs run = a.run;
  run.strategy = preset.string();
  run.overrides.insert(run.overrides.end(), overrides.begin(), overrides.end());
  RunParts parts = make_run_parts(load_run_config(run), loader,
                                  {a.world, std::min(a.world, a.gpus_per_node), 0});
  if (a.device_memory) parts.sizes.device_budget = a.device_memory;
  return parts;
}

// The overrides that turn activation checkpointing on or off; off turns
// its offload off too where the run offloads (whose model has the key).
std::vector<std::string> checkpointing(bool on, bool offloading) {
  std::vector<std::string> set{std::string("model.activation_checkpointing=") +
                               (on ? "true" : "false")};
  if (!on && offloading) set.push_back("model.offload_checkpoints=false");
  return set;
}

// The activations at every degree of each split the world and the model
// take, at the run's micro-batch: fewer data ranks carry the same global
// batch in more accumulation steps. Ulysses' groups stay on one host (its
// degree divides a node's devices); the ring may span hosts. At one
// degree Ulysses comes first (it also needs the heads to divide). The
// strategy shards over every rank whatever the split, so the model states
// do not change with it.
std::vector<Activations> activations_by_sequence(const SizingArgs& a, const fs::path& preset,
                                                 const PluginLoader& loader,
                                                 std::int64_t micro_batch, bool offloading) {
  std::vector<Activations> out;
  for (int degree = 1; degree <= a.world; ++degree) {
    if (a.world % degree != 0) continue;
    for (const bool ring : {false, true}) {
      if (degree == 1 && ring) continue;
      if (!ring && a.gpus_per_node % degree != 0) continue;
      Activations act{degree, ring, 0, 0};
      try {
        const std::vector<std::string> set = {
            std::string(ring ? "parallel.context=" : "parallel.sequence=") + std::to_string(degree),
            std::string(ring ? "parallel.sequence=1" : "parallel.context=1"),
            "train.micro_batch_size=" + std::to_string(micro_batch)};
        std::vector<std::string> off = set, on = set;
        for (const std::string& o : checkpointing(false, offloading)) off.push_back(o);
        for (const std::string& o : checkpointing(true, offloading)) on.push_back(o);
        act.off = parts_of(a, preset, loader, off).sizes.activation_bytes;
        act.on = parts_of(a, preset, loader, on).sizes.activation_bytes;
      } catch (const ConfigError&) {
        continue;  // the model cannot split its sequences this way
      }
      out.push_back(act);
    }
  }
  return out;
}

// The model states and activations of `preset`, with activation
// checkpointing off and on (offloaded to the host as the run says: the run
// with checkpointing on offloads, or not, as it is set), into s.
void size_states(const SizingArgs& a, const fs::path& preset, const PluginLoader& loader,
                 Sized& s) {
  const RunParts with = parts_of(a, preset, loader, checkpointing(true, false));
  const bool offloading = with.sizes.host_activation_bytes > 0;
  const RunParts without = parts_of(a, preset, loader, checkpointing(false, offloading));
  s.activations_on = with.sizes.activation_bytes;
  s.host_activations = with.sizes.host_activation_bytes;
  s.activations_off = without.sizes.activation_bytes;
  // The model states do not depend on checkpointing.
  s.n_params = without.info.n_params;
  s.model = without.info.arch;
  s.states = without.strategy->estimate(without.sizes);
  s.by_sequence =
      activations_by_sequence(a, preset, loader, without.settings.train.micro_batch, offloading);
}

// One preset's row. A preset whose settings cannot hold this model (a
// module larger than its max_live_parameters) is a row saying so and what
// to set, not the end of the table.
Sized size_of(const SizingArgs& a, const fs::path& preset, const PluginLoader& loader) {
  Sized s;
  s.strategy = preset.stem().string();
  try {
    size_states(a, preset, loader, s);
  } catch (const ConfigError& e) {
    s.refused = e.what();
  }
  return s;
}

std::uint64_t tier_total(const MemoryEstimate& e, Tier t) {
  std::uint64_t sum = 0;
  for (std::uint64_t b : e.bytes[t]) sum += b;
  return sum;
}

std::uint64_t device_bytes(const MemoryEstimate& e, Category c) {
  return e.bytes[Tier::device][c];
}

// "fits (12.5 GiB spare)", "fits with activation checkpointing (...)" or
// "does not fit (3.1 GiB short with activation checkpointing)".
std::string verdict(std::uint64_t without, std::uint64_t with, std::uint64_t memory) {
  if (without <= memory) return "fits (" + format_bytes(memory - without) + " spare)";
  if (with <= memory)
    return "fits with activation checkpointing (" + format_bytes(memory - with) + " spare)";
  return "does not fit (" + format_bytes(with - memory) + " short with activation checkpointing)";
}

// The smallest split at which the preset fits `memory`: "1", "4 ckpt"
// (Ulysses at 4 with activation checkpointing), "ctx 8" (the ring at 8),
// or "-" for none.
std::string sequence_to_fit(const Sized& s, std::uint64_t states, std::uint64_t memory) {
  for (const Activations& act : s.by_sequence) {
    if (states + act.off <= memory) return act.label();
    if (states + act.on <= memory) return act.label() + " ckpt";
  }
  return "-";
}

}  // namespace

void estimate_all(const SizingArgs& a, std::ostream& os) {
  if (!a.run.deepspeed.empty())
    throw ConfigError(
        "estimate --all tries every strategy preset; drop --deepspeed (plain `ztrain estimate "
        "--deepspeed` sizes that config)");
  if (!a.run.strategy.empty())
    throw ConfigError("estimate --all tries every strategy preset; drop --strategy");
  if (a.world < 1 || a.gpus_per_node < 1 || a.gpus_per_node > 1024)
    throw ConfigError("estimate --all: --world must be 1 or more and --gpus-per-node 1 to 1024");
  const PluginLoader loader(default_plugin_dirs(a.run.plugin_paths), {});
  const std::vector<fs::path> presets = strategy_presets(a.run.config);
  if (presets.empty())
    throw ConfigError("estimate --all: no strategy presets (strategies/*.toml) found beside '" +
                      a.run.config.string() + "' or in the installed configs");
  std::vector<Sized> rows;
  for (const fs::path& p : presets) rows.push_back(size_of(a, p, loader));
  const auto sized =
      std::find_if(rows.begin(), rows.end(), [](const Sized& s) { return s.refused.empty(); });
  if (sized == rows.end())
    throw ConfigError("estimate --all: no preset can run this model: " + rows.front().refused);
  const Sized& any = *sized;
  os << "estimate --all: " << any.model << ", " << any.n_params << " parameters, " << a.world
     << (a.world == 1 ? " rank" : " ranks") << ", " << a.gpus_per_node << " per node";
  if (a.device_memory) os << "; devices of " << format_bytes(*a.device_memory);
  os << "\n";
  char line[400];
  std::snprintf(line, sizeof line,
                "%-15s %10s %10s %10s %10s %10s %10s %11s %11s %11s %11s %11s  %s\n", "strategy",
                "params", "grads", "optimizer", "buffers", "act", "act ckpt", "device", "dev ckpt",
                "host/node", "nvme/node", "seq fits", "fits");
  os << line;
  for (const Sized& s : rows) {
    if (!s.refused.empty()) {
      std::snprintf(line, sizeof line,
                    "%-15s %10s %10s %10s %10s %10s %10s %11s %11s %11s %11s %11s  ",
                    s.strategy.c_str(), "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-");
      os << line << "cannot run as set: " << s.refused << "\n";
      continue;
    }
    const std::uint64_t states = tier_total(s.states, Tier::device);
    const std::uint64_t buffers = states - device_bytes(s.states, Category::params) -
                                  device_bytes(s.states, Category::grads) -
                                  device_bytes(s.states, Category::optimizer);
    const std::uint64_t per_node = static_cast<std::uint64_t>(a.gpus_per_node);
    const std::uint64_t total_off = states + s.activations_off,
                        total_on = states + s.activations_on;
    const std::string seq =
        a.device_memory ? sequence_to_fit(s, states, *a.device_memory) : std::string("-");
    std::snprintf(
        line, sizeof line, "%-15s %10s %10s %10s %10s %10s %10s %11s %11s %11s %11s %11s  %s\n",
        s.strategy.c_str(), format_bytes(device_bytes(s.states, Category::params)).c_str(),
        format_bytes(device_bytes(s.states, Category::grads)).c_str(),
        format_bytes(device_bytes(s.states, Category::optimizer)).c_str(),
        format_bytes(buffers).c_str(), format_bytes(s.activations_off).c_str(),
        format_bytes(s.activations_on).c_str(), format_bytes(total_off).c_str(),
        format_bytes(total_on).c_str(),
        format_bytes((tier_total(s.states, Tier::host) + s.host_activations) * per_node).c_str(),
        format_bytes(tier_total(s.states, Tier::nvme) * per_node).c_str(), seq.c_str(),
        a.device_memory ? verdict(total_off, total_on, *a.device_memory).c_str()
                        : "- (give --device-memory)");
    os << line;
  }
  os << "(per device: the strategy's estimate, each category at its peak; buffers: "
        "communication and offload staging; act: activations, ckpt: with activation "
        "checkpointing; device: their sum; seq fits: the smallest [parallel] sequence degree "
        "(Ulysses, within a node) or context degree (ctx: ring attention, across nodes) at "
        "which the device fits, each sequence split over that many devices)\n";
}

}  // namespace ztrain
