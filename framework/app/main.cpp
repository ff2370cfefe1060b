// ztrain: argument parsing and dispatch only.
#include <unistd.h>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/program_options.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/tools.h"
#include "checkpoint/weights.h"
#include "comm/start_faults.h"
#include "comm/world.h"
#include "commands/compare.h"
#include "commands/estimate_table.h"
#include "commands/html_report.h"
#include "commands/prepare.h"
#include "commands/prepare_tokenized.h"
#include "commands/report.h"
#include "commands/sample.h"
#include "commands/schedule_command.h"
#include "commands/sft_check.h"
#include "config/accelerate_import.h"
#include "config/deepspeed_import.h"
#include "core/hold_points.h"
#include "io/durable_file.h"
#include "io/fault_plan.h"
#include "job/launcher.h"
#include "job/local_ranks.h"
#include "job/out_dir_lock.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/block_gemm.h"
#include "loader/plugin_loader.h"
#include "shard/aio_fault.h"
#include "train/trainer.h"
#include "ztrain/comm.h"
#include "ztrain/error.h"
#include "ztrain/units.h"
#include "ztrain/version.h"

namespace po = boost::program_options;

namespace {

// "[rank N] " when several ranks share the terminal, so errors say whose they are.
std::string rank_prefix() {
  if (!ztrain::launched_by_mpi() && !ztrain::launched_by_env()) return "";
  return "[rank " + std::to_string(ztrain::launcher_rank()) + "] ";
}

// An error's message as printed: a message that echoes a huge value (a
// 10 MB string) is cut in the middle, keeping where and what to do.
std::string shown(const char* what) {
  const std::string_view m(what);
  constexpr std::size_t kHead = 3000, kTail = 1000;
  if (m.size() <= kHead + kTail + 100) return std::string(m);
  return std::string(m.substr(0, kHead)) + " [... " + std::to_string(m.size() - kHead - kTail) +
         " bytes cut ...] " + std::string(m.substr(m.size() - kTail));
}

constexpr const char* kUsage =
    "usage: ztrain [options] CONFIG            train the run described by CONFIG (TOML)\n"
    "       ztrain --nproc N [options] CONFIG  N ranks on this machine (mpirun)\n"
    "       ztrain --hostfile FILE [--include S | --exclude S] [--env VAR]... [options] CONFIG\n"
    "                                           ranks on the hosts' slots; each host's\n"
    "                                           CUDA_VISIBLE_DEVICES is its slot ids, as in\n"
    "                                           DeepSpeed (also --num_nodes, --num_gpus,\n"
    "                                           --master_addr, --master_port)\n"
    "       ztrain plugins [--plugin-path DIR]  list the plugins found, with their options\n"
    "       ztrain estimate [--world N] [options] CONFIG\n"
    "                                           bytes per rank the run would need, by tier and\n"
    "                                           category (nothing is allocated)\n"
    "       ztrain estimate --all [--world N] [--gpus-per-node G] [--device-memory 80GiB] CONFIG\n"
    "                                           the same for every strategy preset, with and\n"
    "                                           without activation checkpointing; fits or not\n"
    "       ztrain config [options] CONFIG      every key of the run, defaults included, with\n"
    "                                           where each value comes from (a run file itself)\n"
    "       ztrain --resume[=DIR] [options] CONFIG\n"
    "                                           continue from a checkpoint: out_dir's latest, or\n"
    "                                           DIR (a step_<N> directory or a run directory);\n"
    "                                           any world size and strategy\n"
    "       ztrain export RUN_DIR|FILE|CHECKPOINT OUT [--dtype fp32|bf16|fp16] [--overwrite]\n"
    "                                           write weights as safetensors with Hugging Face\n"
    "                                           names (OUT: a .safetensors file, or a directory\n"
    "                                           that gets model.safetensors and config.json)\n"
    "       ztrain checkpoint info CHECKPOINT   what a checkpoint holds; verifies every checksum\n"
    "       ztrain sample DIR --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K] [--seed "
    "S]\n"
    "                                           continue TEXT with the model of a run directory\n"
    "                                           or an export (greedy unless --temperature)\n"
    "       ztrain sample DIR --chat TEXT [--system TEXT] [--max-tokens N] ...\n"
    "                                           the model's answer to TEXT, asked through DIR's\n"
    "                                           chat template\n"
    "       ztrain prepare --tokenizer tokenizer.json --out DIR [--text-field F] [--shard-tokens "
    "N]\n"
    "                      [--val-tokens N | --val-fraction F] [--separator TOKEN|none]\n"
    "                      [--replace-invalid-utf8] INPUT...\n"
    "                                           text files, globs and JSON lines into llm.c\n"
    "                                           token shards (DIR/train_*.bin, val_*.bin) and\n"
    "                                           DIR/manifest.json, on every core\n"
    "       ztrain prepare --dataset-dir D --dataset A[,B] --out DIR [sft-check's options] "
    "MODEL_DIR\n"
    "                                           fine-tuning examples encoded once, their ids and\n"
    "                                           masks saved in DIR for [data] tokenized_path\n"
    "       ztrain sft-check --dataset-dir D --dataset A[,B] [--cutoff-len N] [--train-on-prompt]\n"
    "                        [--mask-history] [--max-samples N] [--template FILE.jinja|NAME]\n"
    "                        MODEL_DIR\n"
    "                                           what fine-tuning on LLaMA-Factory datasets would\n"
    "                                           train on: rows read and bad, tokens trained, the\n"
    "                                           first example with its trained text marked\n"
    "       ztrain --llamafactory TRAIN.yaml [options]\n"
    "                                           train as LLaMA-Factory's YAML describes (model,\n"
    "                                           method, datasets, Trainer and deepspeed keys)\n"
    "       ztrain --deepspeed DS.json [options] CONFIG\n"
    "                                           train with a DeepSpeed config's ZeRO, offload,\n"
    "                                           batch, precision, optimizer and scheduler keys\n"
    "       ztrain convert-deepspeed DS.json [--nproc N] CONFIG\n"
    "                                           the whole run as TOML; refuses (exit 2) what a "
    "run\n"
    "                                           at N ranks (default 1) would refuse\n"
    "       ztrain compare --strategies A,B,... [--nproc N] [--steps K] [--out DIR] [options] "
    "CONFIG\n"
    "                                           each strategy as its own job on the same run; one\n"
    "                                           table (time, memory, communication, losses), CSV,\n"
    "                                           JSON, an HTML report, and the equivalence verdict\n"
    "       ztrain report RUN_DIR [RUN_DIR...] [--out FILE.html]\n"
    "                                           the same HTML report for runs already trained\n"
    "                                           (their out_dir: metrics.jsonl, config.toml),\n"
    "                                           overlaid; default RUN_DIR/report.html\n"
    "       ztrain schedule NAME --stages P --micro-batches M [--chunks V]\n"
    "                                           a pipeline schedule's plan (gpipe, 1f1b,\n"
    "                                           interleaved, or a schedule plugin's), checked;\n"
    "                                           each stage's order and idle time\n"
    "\n"
    "examples:\n"
    "  ztrain configs/run.toml\n"
    "  ztrain --strategy ddp --set train.steps=20 configs/run.toml\n"
    "  ztrain --model gpt2-tiny --set train.steps=50 configs/run.toml\n";

// `--resume` takes the next argument unless that is an option or a run
// file (`--resume DIR run.toml`, `--resume latest`); alone it stands for
// out_dir's latest checkpoint (`--resume run.toml`). A directory that is
// not there is taken too, so the error says so rather than that two run
// files were given.
std::vector<std::string> resume_argument(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] != "--resume") continue;
    const auto run_file = [](const std::string& a) {
      return a.ends_with(".toml") || std::filesystem::is_regular_file(a);
    };
    const bool takes = i + 1 < args.size() && !args[i + 1].starts_with("-") &&
                       (args[i + 1] == "latest" || !run_file(args[i + 1]));
    args[i] = "--resume=" + (takes ? args[i + 1] : std::string("latest"));
    if (takes) args.erase(args.begin() + static_cast<std::ptrdiff_t>(i) + 1);
  }
  return args;
}

// "a,b,c" -> {a, b, c}; "" -> {}; empty items are kept (and refused by
// whoever reads them).
std::vector<std::string> comma_list(const std::string& text) {
  std::vector<std::string> items;
  if (text.empty()) return items;
  for (std::size_t at = 0; at <= text.size();) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    items.push_back(text.substr(at, comma - at));
    at = comma + 1;
  }
  return items;
}

// The plugins found, then the files of the search directories that were
// not taken and why: a plugin built for another ztrain must not just be
// missing from the list. With -v, first the GEMM library and kernels the
// cpu device would run, and what runs attention's block products.
int list_plugins(const ztrain::PluginLoader& loader, bool verbose) {
  if (verbose) {
    const ztrain::blas::Report& gemms = ztrain::blas::report();
    std::cout << "GEMMs: " << gemms.line() << "\n";
    if (const std::string w = gemms.warning(); !w.empty()) std::cout << w << "\n";
    std::cout << "attention's block products: " << ztrain::vec::block_gemm_name() << "\n";
  }
  const auto scan = loader.load_all();
  if (scan.plugins.empty()) {
    std::cout << "no plugins found; searched:\n";
    for (const auto& d : loader.search_dirs()) std::cout << "  " << d.string() << "\n";
  }
  for (const char* kind : {"model", "data", "strategy", "schedule"}) {
    for (const auto& p : scan.plugins) {
      if (std::string(p.info().kind) != kind) continue;
      std::cout << kind << " " << p.info().name << " " << p.info().version << " - "
                << p.info().description << "\n    file: " << p.file().string() << "\n";
      for (const auto& o : p.options().specs()) {
        std::cout << "    " << o.name << " (" << ztrain::option_type_name(o.type) << ", default "
                  << ztrain::option_value_text(o.default_value) << ")";
        if (!o.choices.empty() || o.min || o.max) std::cout << " [" << o.expectation() << "]";
        std::cout << ": " << o.help << "\n";
      }
    }
  }
  if (!scan.passed_over.empty()) std::cout << "not loaded:\n";
  for (const auto& [file, why] : scan.passed_over) {
    const std::string prefix = file.string() + ": ";
    std::cout << "  " << file.string() << "\n    "
              << (why.starts_with(prefix) ? why.substr(prefix.size()) : why) << "\n";
  }
  return scan.plugins.empty() ? 1 : 0;
}

// The command line, parsed.
// The faults of a test's plan that act outside the training loop, handed
// to the parts they break (the loop's own travel in TrainArgs).
void hand_over(const ztrain::FaultPlan& faults) {
  ztrain::plan_start_fault(faults.start_kill);
  ztrain::plan_write_error(faults.write_error);
  ztrain::shard::plan_aio_error(faults.nvme_error, faults.nvme_error_after);
  ztrain::plan_holds(faults.holds);
}

// --parallel KEY=N,... as the --set parallel.KEY=N overrides it stands
// for; a word that is not KEY=N is refused (the key itself is checked
// with the [parallel] section).
std::vector<std::string> parallel_overrides(const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& item : comma_list(text)) {
    const auto eq = item.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == item.size())
      throw ztrain::ConfigError("--parallel " + text + ": \"" + item +
                                "\" is not KEY=N (e.g. --parallel context=2,sequence=2)");
    out.push_back("parallel." + item);
  }
  return out;
}

struct Cli {
  std::vector<std::string> overrides, plugin_paths, positional, env_vars;
  std::string strategy, model, dtype = "fp32", hostfile, include, exclude, resume, strategies,
                               compare_out, deepspeed, accelerate, device_memory, parallel,
                               llamafactory;
  std::int64_t steps = 0;
  std::string tokenizer, text_field = "text", separator;
  std::uint64_t shard_tokens = 100'000'000, val_tokens = 0;
  double val_fraction = 0;
  std::string prompt, chat, system;
  int max_tokens = 64, top_k = 0;
  double temperature = 0;
  std::uint64_t sample_seed = 0;
  int gpus_per_node = 1, nproc = 0, world = 1, num_nodes = -1, num_gpus = -1;
  std::string master_addr, master_port;
  std::string command_line;  // as typed, for the reports' metadata
  bool all_strategies = false, verbose = false, dry_run = false, overwrite = false;
  bool replace_invalid_utf8 = false;
  std::string dataset_dir, datasets, chat_template = "auto";  // sft-check
  std::size_t cutoff_len = 2048, max_samples = 0;
  bool train_on_prompt = false, mask_history = false;
  std::size_t stages = 0, micro_batches = 0, chunks = 1;  // schedule
  ztrain::FaultPlan faults;                               // a test's, from the environment
  po::variables_map given;

  // The run a config file and the command line describe.
  ztrain::TrainArgs run_args(const std::string& config) const {
    ztrain::TrainArgs args;
    args.config = config;
    args.strategy = strategy;
    args.model = model;
    args.overrides = overrides;
    args.plugin_paths = plugin_paths;
    args.verbose = verbose;
    args.overwrite = overwrite;
    args.deepspeed = deepspeed;
    args.accelerate = accelerate;
    args.llamafactory = llamafactory;
    args.faults = faults;
    return args;
  }
  ztrain::PluginLoader loader() const { return ztrain::command_line_loader(plugin_paths, verbose); }
};

po::options_description declare_options(Cli& c) {
  po::options_description opts("options");
  opts.add_options()("help,h", "show this help")("version", "print the version")(
      "strategy,s", po::value(&c.strategy),
      "strategy preset (configs/strategies/NAME.toml) or plugin name/path")(
      "model,m", po::value(&c.model), "model preset (configs/models/NAME.toml) replacing [model]")(
      "set", po::value(&c.overrides)->composing(),
      "override a config key: --set section.key=value (repeatable)")(
      "parallel", po::value(&c.parallel),
      "the mesh's degrees, comma-separated: --parallel context=2,sequence=2 is --set "
      "parallel.context=2 --set parallel.sequence=2 (for a run, estimate or every job of "
      "compare); --set wins")(
      "plugin-path", po::value(&c.plugin_paths)->composing(),
      "extra plugin directory, searched first (repeatable; colon-separated lists too)")(
      "verbose,v", po::bool_switch(&c.verbose), "log plugin discovery and set-up")(
      "overwrite", po::bool_switch(&c.overwrite),
      "replace an earlier run in out_dir, an existing export_to, or export's OUT")(
      "dtype", po::value(&c.dtype), "export: dtype of the written weights (fp32, bf16, fp16)")(
      "resume", po::value(&c.resume),
      "continue from a checkpoint: --resume (out_dir's latest), --resume DIR or --resume=DIR")(
      "nproc", po::value(&c.nproc), "start N ranks on this machine (through mpirun)")(
      "world", po::value(&c.world)->default_value(1), "estimate: the number of ranks")(
      "all", po::bool_switch(&c.all_strategies), "estimate: a table across every strategy preset")(
      "gpus-per-node", po::value(&c.gpus_per_node), "estimate --all: devices per node")(
      "device-memory", po::value(&c.device_memory),
      "estimate --all: each device's memory (e.g. 80GiB): fits or not, with the margin")(
      "hostfile", po::value(&c.hostfile), "start ranks on the hosts of a DeepSpeed hostfile")(
      "include", po::value(&c.include), "hostfile hosts/slots to use: host[:0,1][@host...]")(
      "exclude", po::value(&c.exclude), "hostfile hosts/slots to leave out: host[:0,1][@host...]")(
      "env", po::value(&c.env_vars)->composing(),
      "environment variable that travels to every rank (repeatable; also .ztrain_env)")(
      "dry-run", po::bool_switch(&c.dry_run), "with --nproc/--hostfile: print the launch command")(
      "num_nodes", po::value(&c.num_nodes),
      "DeepSpeed's: the first N hosts of the hostfile (not with --include/--exclude)")(
      "num_gpus", po::value(&c.num_gpus),
      "DeepSpeed's: the first N slots of each host (without a hostfile: --nproc N)")(
      "master_addr", po::value(&c.master_addr),
      "DeepSpeed's: exported as MASTER_ADDR to every rank (ranks mpirun starts meet through "
      "MPI and do not need it)")("master_port", po::value(&c.master_port),
                                 "DeepSpeed's: exported as MASTER_PORT to every rank")(
      "deepspeed", po::value(&c.deepspeed),
      "a DeepSpeed config (ds_config.json) for the strategy and training keys; --set wins")(
      "llamafactory", po::value(&c.llamafactory),
      "LLaMA-Factory's training YAML as the run (in place of CONFIG): its model, method, "
      "datasets and Trainer keys, its deepspeed config as --deepspeed; --set wins")(
      "accelerate-config", po::value(&c.accelerate),
      "an Accelerate config (what `accelerate config` writes): strategy, precision, device and "
      "num_processes ranks, as `accelerate launch` runs it (on several machines: run it on each, "
      "its file giving machine_rank); --set wins")("strategies", po::value(&c.strategies),
                                                   "compare: the strategies, comma-separated")(
      "steps", po::value(&c.steps), "compare: steps per job (default: the run's train.steps)")(
      "out", po::value(&c.compare_out),
      "compare: where the jobs and reports go (runs/compare); report: the page "
      "(RUN_DIR/report.html); prepare: the output directory")(
      "tokenizer", po::value(&c.tokenizer), "prepare: a Hugging Face tokenizer.json")(
      "text-field", po::value(&c.text_field), "prepare: the documents' field in JSON lines (text)")(
      "shard-tokens", po::value(&c.shard_tokens), "prepare: tokens per shard (100000000)")(
      "val-tokens", po::value(&c.val_tokens),
      "prepare: the first documents, up to this many tokens, are held out (val_*.bin)")(
      "val-fraction", po::value(&c.val_fraction),
      "prepare: each document is held out with this probability (by its index)")(
      "replace-invalid-utf8", po::bool_switch(&c.replace_invalid_utf8),
      "prepare: read bytes that are not UTF-8 as U+FFFD (Python's errors=\"replace\") instead "
      "of refusing the file")("prompt", po::value(&c.prompt), "sample: the text to continue")(
      "dataset-dir", po::value(&c.dataset_dir),
      "sft-check: the directory of LLaMA-Factory's dataset_info.json")(
      "dataset", po::value(&c.datasets), "sft-check: dataset names, comma-separated")(
      "cutoff-len", po::value(&c.cutoff_len), "sft-check: tokens an example is cut to (2048)")(
      "max-samples", po::value(&c.max_samples),
      "sft-check: each dataset's first rows taken (LLaMA-Factory's max_samples; 0: all)")(
      "train-on-prompt", po::bool_switch(&c.train_on_prompt),
      "sft-check: train on the prompts' tokens too")(
      "mask-history", po::bool_switch(&c.mask_history),
      "sft-check: train on each example's last answer only")(
      "template", po::value(&c.chat_template),
      "sft-check: a chat template (.jinja) instead of the model directory's own, or a "
      "LLaMA-Factory template's name (llama3, qwen, qwen3, qwen3_nothink)")(
      "chat", po::value(&c.chat),
      "sample: a user's message, rendered with the model directory's chat template")(
      "system", po::value(&c.system), "sample: with --chat, a system message before it")(
      "max-tokens", po::value(&c.max_tokens), "sample: tokens to add (64)")(
      "temperature", po::value(&c.temperature), "sample: 0 takes the likeliest token (greedy)")(
      "top-k", po::value(&c.top_k), "sample: draw among the K likeliest (0: all)")(
      "seed", po::value(&c.sample_seed), "sample: the draws' seed (0)")(
      "stages", po::value(&c.stages), "schedule: the pipeline's stages")(
      "micro-batches", po::value(&c.micro_batches), "schedule: a step's micro-batches")(
      "chunks", po::value(&c.chunks), "schedule: model chunks a stage (interleaved; 1)")(
      "separator", po::value(&c.separator),
      "prepare: the token each document starts with (default: the tokenizer's BOS, else its "
      "EOS), or none");
  return opts;
}

// Refuses a subcommand given the wrong number of words (`usage` says the right form).
void expect_words(const Cli& c, std::size_t words, const std::string& usage) {
  if (c.positional.size() != words) throw ztrain::ConfigError("usage: " + usage);
}

// The ranks an estimate is for: --world, or --nproc as a launch would take
// it (not both, unless they agree); a hostfile's ranks are its slots.
int estimate_world(const Cli& c) {
  if (!c.hostfile.empty())
    throw ztrain::ConfigError(
        "estimate --hostfile: give the number of ranks with --world N (the hostfile's slots)");
  if (!c.given.count("nproc")) return c.world;
  if (!c.given["world"].defaulted() && c.world != c.nproc)
    throw ztrain::ConfigError("estimate: --nproc " + std::to_string(c.nproc) + " and --world " +
                              std::to_string(c.world) + " disagree; give one");
  return c.nproc;
}

int estimate_command(const Cli& c) {
  expect_words(c, 2, "ztrain estimate [--world N] [options] CONFIG");
  const int world = estimate_world(c);
  if (world < 1)
    throw ztrain::ConfigError("--world " + std::to_string(world) + ": give 1 or more ranks");
  if (c.all_strategies) {
    ztrain::SizingArgs sizing{c.run_args(c.positional[1]), world, c.gpus_per_node, std::nullopt};
    if (!c.device_memory.empty()) sizing.device_memory = ztrain::parse_size(c.device_memory);
    ztrain::estimate_all(sizing, std::cout);
    return 0;
  }
  if (c.given.count("gpus-per-node") || !c.device_memory.empty())
    throw ztrain::ConfigError("--gpus-per-node and --device-memory go with estimate --all");
  ztrain::estimate(c.run_args(c.positional[1]), world, std::cout);
  return 0;
}

int export_command(const Cli& c) {
  expect_words(c, 3,
               "ztrain export RUN_DIR|FILE|CHECKPOINT OUT [--dtype fp32|bf16|fp16] [--overwrite]");
  const ztrain::DType type = ztrain::parse_precision(c.dtype, "--dtype");
  const std::string &from = c.positional[1], &to = c.positional[2];
  // A run directory with checkpoints and final weights exports the final weights.
  if (ztrain::is_checkpoint(from) &&
      !std::filesystem::exists(std::filesystem::path(from) / "model.safetensors")) {
    const auto read = ztrain::export_checkpoint(from, to, type, c.overwrite, c.loader());
    std::cout << "wrote " << to << " from " << read.string() << "\n";
    return 0;
  }
  ztrain::convert_weights(from, to, type, c.overwrite);
  std::cout << "wrote " << to << "\n";
  return 0;
}

// sft-check's and prepare's fine-tuning request: the datasets, the model
// directory and the keys that shape the examples.
ztrain::SftRequest sft_request(const Cli& c) {
  ztrain::SftRequest a;
  a.dataset_dir = c.dataset_dir;
  a.model_dir = c.positional[1];
  a.chat_template = c.chat_template;
  a.cutoff_len = c.cutoff_len;
  a.max_samples = c.max_samples;
  a.train_on_prompt = c.train_on_prompt;
  a.mask_history = c.mask_history;
  a.template_where = "--template";
  for (std::size_t at = 0; at <= c.datasets.size();) {
    const std::size_t comma = std::min(c.datasets.find(',', at), c.datasets.size());
    if (comma > at) a.datasets.push_back(c.datasets.substr(at, comma - at));
    at = comma + 1;
  }
  return a;
}

int prepare_command(const Cli& c) {
  if (c.given.count("dataset")) {
    expect_words(c, 2,
                 "ztrain prepare --dataset-dir D --dataset A[,B] --out DIR [--cutoff-len N] "
                 "MODEL_DIR");
    if (c.compare_out.empty())
      throw ztrain::ConfigError("prepare --dataset: --out DIR names where the examples go");
    ztrain::SftRequest a = sft_request(c);
    a.tokenized_path = c.compare_out;
    ztrain::prepare_tokenized(a, std::cout);
    return 0;
  }
  if (c.positional.size() < 2 || c.tokenizer.empty() || c.compare_out.empty())
    throw ztrain::ConfigError(
        "usage: ztrain prepare --tokenizer tokenizer.json --out DIR [options] INPUT...");
  ztrain::PrepareArgs a;
  a.tokenizer = c.tokenizer;
  a.inputs.assign(c.positional.begin() + 1, c.positional.end());
  a.out = c.compare_out;
  a.text_field = c.text_field;
  a.shard_tokens = c.shard_tokens;
  a.val_tokens = c.val_tokens;
  a.val_fraction = c.val_fraction;
  if (c.given.count("separator")) a.separator = c.separator;
  a.overwrite = c.overwrite;
  a.replace_invalid_utf8 = c.replace_invalid_utf8;
  return ztrain::prepare(a, std::cerr);
}

// The subcommands other than training; nullopt when the command line trains.
std::optional<int> tool_command(const Cli& c) {
  const std::string command = c.positional.empty() ? "" : c.positional[0];
  if (command == "plugins") {
    if (c.positional.size() > 1)
      throw ztrain::ConfigError("'ztrain plugins' takes no arguments (got '" + c.positional[1] +
                                "')");
    return list_plugins(c.loader(), c.verbose);
  }
  if (command == "convert-deepspeed") {
    expect_words(c, 3,
                 "ztrain convert-deepspeed DS.json RUN.toml (the run \"auto\" takes its values "
                 "from)");
    ztrain::TrainArgs args = c.run_args(c.positional[2]);
    // What a run would refuse (at --nproc ranks) is refused here, exit 2,
    // before any TOML is printed.
    args.deepspeed = c.positional[1];
    ztrain::check_run(args, c.given.count("nproc") ? c.nproc : 1);
    // The whole run, not the DeepSpeed keys alone: a file of those would
    // train the default model.
    const std::string whole = ztrain::resolved_config_of(args);
    args.deepspeed.clear();
    const ztrain::RunConfig run = ztrain::load_run_config(args);
    std::cout << ztrain::imported_notes(ztrain::import_deepspeed(c.positional[1], run),
                                        c.positional[1])
              << "# The whole run: " << c.positional[2] << " (and --set) with the DeepSpeed values "
              << "merged; train it with `ztrain THIS_FILE`.\n"
              << whole;
    return 0;
  }
  if (command == "estimate") return estimate_command(c);
  if (command == "config") {
    expect_words(c, 2, "ztrain config [--model M] [--strategy S] [--set k=v ...] CONFIG");
    std::cout << ztrain::resolved_config_of(c.run_args(c.positional[1]));
    return 0;
  }
  if (command == "compare") {
    expect_words(c, 2, "ztrain compare --strategies A,B,... [--nproc N] [--steps K] CONFIG");
    return ztrain::compare({c.run_args(c.positional[1]), comma_list(c.strategies),
                            c.given.count("nproc") ? c.nproc : 1,
                            c.given.count("steps") ? std::optional(c.steps) : std::nullopt,
                            c.compare_out, c.faults.compare_perturb, c.command_line},
                           std::cout);
  }
  if (command == "report") {
    if (c.positional.size() < 2)
      throw ztrain::ConfigError("usage: ztrain report RUN_DIR [RUN_DIR...] [--out FILE.html]");
    return ztrain::report(
        {{c.positional.begin() + 1, c.positional.end()}, c.compare_out, c.command_line}, std::cout);
  }
  if (command == "checkpoint") {
    if (c.positional.size() != 3 || c.positional[1] != "info")
      throw ztrain::ConfigError("usage: ztrain checkpoint info CHECKPOINT");
    return ztrain::checkpoint_info(c.positional[2], c.loader(), std::cout) ? 0 : 1;
  }
  if (command == "export") return export_command(c);
  if (command == "prepare") return prepare_command(c);
  if (command == "sft-check") {
    expect_words(c, 2,
                 "ztrain sft-check --dataset-dir D --dataset A[,B] [--cutoff-len N] MODEL_DIR");
    ztrain::sft_check(sft_request(c), std::cout);
    return 0;
  }
  if (command == "schedule") {
    expect_words(c, 2,
                 "ztrain schedule NAME --stages P --micro-batches M [--chunks V] [--set "
                 "schedule.KEY=VALUE]");
    if (!c.given.count("stages") || !c.given.count("micro-batches"))
      throw ztrain::ConfigError("ztrain schedule: give --stages P and --micro-batches M");
    ztrain::show_schedule({c.positional[1], {c.stages, c.micro_batches, c.chunks}, c.overrides},
                          c.loader(), std::cout);
    return 0;
  }
  if (command == "sample") {
    expect_words(c, 2,
                 "ztrain sample DIR --prompt TEXT | --chat TEXT [--max-tokens N] [--temperature T] "
                 "[--top-k K]");
    ztrain::SampleArgs a{c.positional[1], c.tokenizer,   c.prompt, c.chat,       c.system,
                         c.max_tokens,    c.temperature, c.top_k,  c.sample_seed};
    ztrain::sample(a, c.loader(), std::cout);
    return 0;
  }
  return std::nullopt;
}

// With --nproc or --hostfile: this command line again on every rank,
// through mpirun (exec: this process becomes mpirun). Returns otherwise,
// or after a dry run.
// DeepSpeed's launcher flags onto the plan: --num_nodes/--num_gpus pick
// hosts and slots (DeepSpeed refuses them with --include/--exclude, and so
// does ztrain), --master_addr/--master_port travel as the variables
// DeepSpeed's ranks read.
void deepspeed_flags(const Cli& c, ztrain::LaunchPlan& plan) {
  const bool limits = c.num_nodes >= 0 || c.num_gpus >= 0;
  if (limits && (!c.include.empty() || !c.exclude.empty()))
    throw ztrain::ConfigError(
        "--num_nodes/--num_gpus with --include/--exclude: DeepSpeed refuses them together; "
        "name the slots with --include alone");
  if (!c.hostfile.empty()) {
    plan.hosts = ztrain::limit_hosts(std::move(plan.hosts), c.num_nodes, c.num_gpus);
  } else if (c.num_nodes > 1) {
    throw ztrain::ConfigError("--num_nodes " + std::to_string(c.num_nodes) +
                              " needs a --hostfile naming the hosts");
  } else if (c.num_gpus >= 0) {
    if (c.num_gpus < 1 || (plan.nproc > 0 && plan.nproc != c.num_gpus))
      throw ztrain::ConfigError("--num_gpus " + std::to_string(c.num_gpus) +
                                (plan.nproc > 0
                                     ? " contradicts --nproc " + std::to_string(plan.nproc)
                                     : std::string(": give 1 or more")));
    plan.nproc = c.num_gpus;
  }
  if (!c.master_addr.empty()) plan.env.push_back("MASTER_ADDR=" + c.master_addr);
  if (!c.master_port.empty()) plan.env.push_back("MASTER_PORT=" + c.master_port);
}

// The command line each rank runs: this one, less what only the launch reads.
std::vector<std::string> rank_command(const Cli& c) {
  std::vector<std::string> child{boost::dll::program_location().string()};
  if (!c.strategy.empty()) child.insert(child.end(), {"--strategy", c.strategy});
  if (!c.model.empty()) child.insert(child.end(), {"--model", c.model});
  for (const auto& o : c.overrides) child.insert(child.end(), {"--set", o});
  for (const auto& p : c.plugin_paths) child.insert(child.end(), {"--plugin-path", p});
  if (c.verbose) child.push_back("--verbose");
  if (c.overwrite) child.push_back("--overwrite");
  if (!c.deepspeed.empty()) child.insert(child.end(), {"--deepspeed", c.deepspeed});
  if (!c.accelerate.empty()) child.insert(child.end(), {"--accelerate-config", c.accelerate});
  if (!c.llamafactory.empty())
    child.insert(child.end(), {"--llamafactory", c.llamafactory});  // the run, in place of CONFIG
  else
    child.push_back(c.positional[0]);
  return child;
}

// One machine's ranks of a multi-machine Accelerate file, started here as
// accelerate launch's torchrun would start them; returns the job's status.
int machine_share(const Cli& c, const ztrain::AccelerateLaunch& l) {
  ztrain::check_run(c.run_args(c.positional[0]), l.processes);
  const auto env =
      ztrain::local_rank_env({l.machine_rank, l.per_machine(), l.machines, l.main_ip, l.main_port});
  const auto command = rank_command(c);
  if (c.dry_run) {
    for (const auto& e : env) {
      std::vector<std::string> line(e);
      line.insert(line.end(), command.begin(), command.end());
      std::cout << ztrain::shell_line(line) << "\n";
    }
    return 0;
  }
  return ztrain::run_local_ranks(command, env);
}

// An Accelerate file's launch, as `accelerate launch` starts it, when this
// process is not a rank already: one machine's num_processes ranks, unless
// --nproc, a hostfile or --num_gpus say otherwise (accelerate launch's
// flags win over its file); several machines' from the file alone (their
// ranks' numbering is the file's). Sets what the launch below starts, or
// returns the job's status when the ranks ran here.
std::optional<int> accelerate_launch(Cli& c) {
  if (c.accelerate.empty() || ztrain::launched_by_mpi() || ztrain::launched_by_env())
    return std::nullopt;
  const ztrain::AccelerateLaunch l = ztrain::accelerate_launch(c.accelerate);
  const bool flags = c.nproc > 0 || !c.hostfile.empty() || c.num_gpus >= 0 || c.num_nodes >= 0 ||
                     !c.include.empty() || !c.exclude.empty();
  if (l.machines == 1) {
    if (!flags && l.processes > 1) c.nproc = l.processes;
    return std::nullopt;
  }
  if (flags)
    throw ztrain::ConfigError(
        c.accelerate + ": num_machines is " + std::to_string(l.machines) +
        ": the file says which ranks start where; drop --nproc, --hostfile, --num_gpus, "
        "--num_nodes, --include and --exclude");
  if (l.hostfile.empty()) return machine_share(c, l);
  c.hostfile = l.hostfile.string();
  c.include = l.include;
  c.exclude = l.exclude;
  if (l.include.empty() && l.exclude.empty()) c.num_gpus = l.per_machine();
  if (!l.main_ip.empty()) c.master_addr = l.main_ip;
  c.master_port = std::to_string(l.main_port);
  return std::nullopt;
}

std::optional<int> launch(Cli& c) {
  if (c.nproc < 0 || (c.given.count("nproc") && c.nproc == 0))
    throw ztrain::ConfigError("--nproc " + std::to_string(c.nproc) + ": give 1 or more ranks");
  if (const auto code = accelerate_launch(c)) return code;
  const int nproc = c.nproc;
  const bool launches = nproc > 0 || !c.hostfile.empty() || c.num_gpus >= 0;
  if (!launches && (!c.include.empty() || !c.exclude.empty() || !c.env_vars.empty() || c.dry_run ||
                    c.num_nodes >= 0 || !c.master_addr.empty() || !c.master_port.empty()))
    throw ztrain::ConfigError(
        "--include, --exclude, --env, --num_nodes, --master_addr, --master_port and --dry-run go "
        "with --nproc, --num_gpus or --hostfile");
  if (!launches) return std::nullopt;
  if (ztrain::launched_by_mpi())
    throw ztrain::ConfigError("already started by an MPI launcher; drop --nproc/--hostfile");
  ztrain::LaunchPlan plan;
  plan.nproc = nproc;
  if (!c.hostfile.empty())
    plan.hosts = ztrain::filter_hosts(ztrain::parse_hostfile(c.hostfile), c.include, c.exclude);
  else if (!c.include.empty() || !c.exclude.empty())
    throw ztrain::ConfigError("--include/--exclude need a --hostfile");
  deepspeed_flags(c, plan);
  for (const auto& v : c.env_vars) {
    const char* value = std::getenv(v.c_str());
    if (!value) throw ztrain::ConfigError("--env " + v + ": no such variable in this environment");
    plan.env.push_back(v + "=" + value);
  }
  for (const auto& file :
       {std::string(".ztrain_env"),
        std::string(std::getenv("HOME") ? std::getenv("HOME") : "") + "/.ztrain_env"})
    if (std::filesystem::exists(file)) {
      for (auto& e : ztrain::read_env_file(file)) plan.env.push_back(std::move(e));
      break;
    }
  // Rank 0's output reaches this terminal through mpirun's pipes: say so,
  // so it draws its progress bar (train/progress.h).
  plan.env.push_back(std::string("ZTRAIN_TERMINAL=") +
                     (::isatty(STDOUT_FILENO) && ::isatty(STDERR_FILENO) ? "1" : "0"));
  const auto command = ztrain::mpirun_command(plan, rank_command(c));
  // A DeepSpeed or Accelerate file is checked at the job's world size before
  // any rank starts: a refused file never leaves ranks behind.
  if (!c.deepspeed.empty() || !c.accelerate.empty() || !c.llamafactory.empty()) {
    int world = plan.nproc;
    if (!plan.hosts.empty() && world == 0)
      for (const auto& h : plan.hosts) world += static_cast<int>(h.slots.size());
    ztrain::check_run(c.run_args(c.positional[0]), std::max(1, world));
  }
  if (c.dry_run) {
    std::cout << ztrain::shell_line(command) << "\n";
    return 0;
  }
  std::optional<ztrain::OwnMpiSession> session;
  if (plan.hosts.empty()) session.emplace();
  return ztrain::run_mpirun(command);
}

}  // namespace

int main(int argc, char** argv) {
  Cli c;
  const po::options_description opts = declare_options(c);
  po::options_description hidden;
  hidden.add_options()("args", po::value(&c.positional)->composing());
  po::options_description all;
  all.add(opts).add(hidden);
  po::positional_options_description pos;
  pos.add("args", -1);
  try {
    po::store(
        po::command_line_parser(resume_argument(argc, argv)).options(all).positional(pos).run(),
        c.given);
    po::notify(c.given);
    if (c.given.count("help")) {
      std::cout << kUsage << "\n" << opts;
      return 0;
    }
    if (c.given.count("version")) {
      std::cout << "ztrain " << ZTRAIN_VERSION << "\n";
      return 0;
    }
    c.command_line = ztrain::html::command_line(argc, argv);
    hand_over(c.faults = ztrain::FaultPlan::from_environment());
    // --resume is train.resume, so every rank agrees on it with the rest.
    if (!c.resume.empty()) c.overrides.push_back("train.resume=\"" + c.resume + "\"");
    const std::vector<std::string> mesh = parallel_overrides(c.parallel);
    c.overrides.insert(c.overrides.begin(), mesh.begin(), mesh.end());
    // The YAML is the run: it stands where CONFIG would.
    if (!c.llamafactory.empty()) c.positional.push_back(c.llamafactory);
    if (const auto code = tool_command(c)) return *code;
    if (c.positional.size() != 1) {
      std::cerr << "ztrain: "
                << (c.positional.empty() ? "no run file given" : "more than one run file given")
                << "\n\n"
                << kUsage;
      return 2;
    }
    if (const auto code = launch(c)) return *code;
    ztrain::train(c.run_args(c.positional[0]));
    return 0;
  } catch (const po::error& e) {
    std::cerr << "ztrain: " << e.what() << "\n\n" << kUsage;
    return 2;
  } catch (const ztrain::ReportedError& e) {
    return e.exit_code();
  } catch (const ztrain::ConfigError& e) {
    std::cerr << rank_prefix() << "ztrain: config error: " << shown(e.what()) << "\n";
    return 2;
  } catch (const ztrain::Error& e) {
    std::cerr << rank_prefix() << "ztrain: error: " << shown(e.what()) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << rank_prefix() << "ztrain: unexpected error: " << shown(e.what()) << "\n";
    return 1;
  }
}
