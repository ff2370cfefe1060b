#include "commands/compare.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/dll/runtime_symbol_info.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "commands/compare_report.h"
#include "commands/html_report.h"
#include "commands/report.h"
#include "config/run_settings.h"
#include "io/durable_file.h"
#include "loader/plugin_loader.h"
#include "train/progress.h"
#include "train/run_parts.h"
#include "train/trainer.h"
#include "ztrain/error.h"
#include "ztrain/units.h"

extern char** environ;

namespace ztrain {
namespace fs = std::filesystem;
namespace {

// The name a strategy's job goes by: a preset's or plugin's file stem.
std::string job_label(const std::string& strategy) {
  const fs::path p(strategy);
  return p.has_extension() || p.has_parent_path() ? p.stem().string() : strategy;
}

// The ztrain command of one job, with the --set overrides that are its.
std::vector<std::string> job_command(const CompareArgs& a, const std::string& strategy,
                                     const std::vector<std::string>& overrides, std::int64_t steps,
                                     const fs::path& dir) {
  std::vector<std::string> cmd{boost::dll::program_location().string()};
  if (a.nproc > 1) cmd.insert(cmd.end(), {"--nproc", std::to_string(a.nproc)});
  cmd.insert(cmd.end(), {"--strategy", strategy});
  if (!a.run.model.empty()) cmd.insert(cmd.end(), {"--model", a.run.model});
  for (const auto& o : overrides) cmd.insert(cmd.end(), {"--set", o});
  // Every step logged, one evaluation at the end, nothing else written.
  const std::string k = std::to_string(steps);
  for (const std::string& o : std::vector<std::string>{
           "train.steps=" + k, "train.log_every=1", "train.eval_every=" + k,
           "train.save_final=false", "train.checkpoint_every=0", "train.out_dir=" + dir.string()})
    cmd.insert(cmd.end(), {"--set", o});
  for (const auto& p : a.run.plugin_paths) cmd.insert(cmd.end(), {"--plugin-path", p});
  cmd.push_back("--overwrite");
  cmd.push_back(a.run.config.string());
  return cmd;
}

// This process's environment, with the perturbation of `perturb` (see
// CompareArgs) when it names `label`.
std::vector<std::string> job_environment(const std::string& label, const std::string& perturb) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  const std::size_t colon = perturb.rfind(':');
  if (colon != std::string::npos && perturb.substr(0, colon) == label)
    env.push_back("ZTRAIN_TEST_SCALE_LR=" + perturb.substr(colon + 1));
  return env;
}

// Starts `cmd` with `env` and its output into `log`.
pid_t spawn(const std::vector<std::string>& cmd, const std::vector<std::string>& env,
            const fs::path& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> argv;
  for (const auto& s : cmd) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& s : env) envp.push_back(const_cast<char*>(s.c_str()));
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw Error("cannot start '" + cmd[0] + "': " + std::strerror(rc));
  return pid;
}

// Training lines written so far into a job's metrics.
std::int64_t steps_logged(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::int64_t n = 0;
  for (std::string line; std::getline(in, line);)
    if (line.find("\"split\": \"train\"") != std::string::npos) ++n;
  return n;
}

// Why a job ended early, from its output: its last error line.
void classify_failure(const fs::path& log, int status, ComparedJob& job) {
  std::ifstream in(log);
  std::string last_error;
  for (std::string line; std::getline(in, line);)
    if (line.find("error") != std::string::npos || line.find("out of memory") != std::string::npos)
      last_error = line;
  const bool oom = last_error.find("out of memory") != std::string::npos ||
                   last_error.find("memory_limit") != std::string::npos;
  job.outcome = oom ? JobOutcome::out_of_memory : JobOutcome::failed;
  job.oom = parse_oom(last_error);
  // "[rank 0] ztrain: error: out of memory ..." -> "out of memory ..."
  for (const char* prefix : {"config error: ", "error: "})
    if (const std::size_t at = last_error.find(prefix); at != std::string::npos) {
      last_error.erase(0, at + std::strlen(prefix));
      break;
    }
  job.error =
      !last_error.empty() ? last_error
      : WIFSIGNALED(status)
          ? "killed by signal " + std::to_string(WTERMSIG(status)) + " (see " + log.string() + ")"
          : "exit " + std::to_string(WEXITSTATUS(status)) + " (see " + log.string() + ")";
}

// Runs one job to its end, saying its step as it goes.
ComparedJob run_job(const CompareArgs& a, const std::string& strategy,
                    const std::vector<std::string>& overrides, std::size_t index,
                    std::int64_t steps, const fs::path& out, std::ostream& os) {
  ComparedJob job;
  job.strategy = job_label(strategy);
  const fs::path dir = out / job.strategy, log = out / (job.strategy + ".log");
  const bool terminal = ::isatty(STDERR_FILENO);
  const std::string head = "[" + std::to_string(index + 1) + "/" +
                           std::to_string(a.strategies.size()) + "] " + job.strategy + ": ";
  const pid_t pid = spawn(job_command(a, strategy, overrides, steps, dir),
                          job_environment(job.strategy, a.perturb), log);
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) throw Error(std::string("waitpid: ") + std::strerror(errno));
    if (terminal)
      std::fprintf(stderr, "\r%sstep %lld/%lld ", head.c_str(),
                   static_cast<long long>(steps_logged(dir / "metrics.jsonl")),
                   static_cast<long long>(steps));
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  if (fs::exists(dir / "metrics.jsonl")) read_job_metrics(dir / "metrics.jsonl", job);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) classify_failure(log, status, job);
  if (terminal) std::fprintf(stderr, "\r\033[K");
  os << head << outcome_name(job.outcome) << " after " << job.steps.size() << " of " << steps
     << " steps (log: " << log.string() << ")\n"
     << std::flush;
  return job;
}

void check_args(const CompareArgs& a) {
  if (!a.run.strategy.empty() || !a.run.deepspeed.empty())
    throw ConfigError(
        "compare takes --strategies A,B,..., not --strategy or --deepspeed (a strategy preset "
        "file, a [strategy] table alone, may be one of them)");
  if (a.strategies.empty())
    throw ConfigError("compare: give the strategies, e.g. --strategies ddp,zero1,zero2,zero3");
  std::set<std::string> seen;
  for (const auto& s : a.strategies)
    if (s.empty() || !seen.insert(job_label(s)).second)
      throw ConfigError("compare: strategy '" + s + "' " +
                        (s.empty() ? "is empty" : "is given twice") + " in --strategies");
  if (a.nproc < 1)
    throw ConfigError("compare: --nproc " + std::to_string(a.nproc) + ": give 1 or more ranks");
  if (a.steps && *a.steps < 1)
    throw ConfigError("compare: --steps " + std::to_string(*a.steps) +
                      ": give 1 or more (or leave it out for the run's train.steps)");
}

// The [strategy] key an override sets ("offload_optimizer.nvme_path" of
// "strategy.offload_optimizer.nvme_path=DIR"); empty for any other section
// and for strategy.plugin, which every job takes.
std::string strategy_key(const std::string& override_text) {
  const std::string key = override_text.substr(0, override_text.find('='));
  if (key.rfind("strategy.", 0) != 0 || key == "strategy.plugin") return {};
  return key.substr(std::string("strategy.").size());
}

// Every strategy of the comparison names a preset or a plugin that loads,
// checked before any job runs: a misspelt last name used to be found after
// the others had trained. Returns each job's --set overrides: a [strategy]
// key goes to the jobs whose strategy declares it (nvme_path to zero3_nvme,
// not to zero3), said in a note; one that no strategy declares is refused.
std::vector<std::vector<std::string>> check_strategies(const CompareArgs& a, std::ostream& os) {
  const PluginLoader loader(default_plugin_dirs(a.run.plugin_paths), {});
  std::string bad;
  std::vector<std::vector<std::string>> overrides(a.strategies.size());
  std::map<std::string, std::vector<std::string>> takers;  // override -> labels
  for (std::size_t i = 0; i < a.strategies.size(); ++i) {
    TrainArgs run = a.run;
    run.strategy = a.strategies[i];
    try {
      const auto lib = loader.load("strategy", load_run_config(run).plugin("strategy", "ddp"));
      for (const auto& o : a.run.overrides) {
        const std::string key = strategy_key(o);
        if (!key.empty() && !lib.options().find(key)) continue;
        overrides[i].push_back(o);
        if (!key.empty()) takers[o].push_back(job_label(a.strategies[i]));
      }
    } catch (const Error& e) {
      const std::string why = e.what();
      bad += std::string(bad.empty() ? "" : "\n") + "  " + a.strategies[i] + ": " +
             why.substr(0, why.find(';'));
    }
  }
  if (!bad.empty())
    throw ConfigError(
        "compare: not every strategy can run, so none was started (`ztrain plugins` "
        "lists the strategies found):\n" +
        bad);
  for (const auto& o : a.run.overrides) {
    if (strategy_key(o).empty()) continue;
    const auto& t = takers[o];
    if (t.empty())
      throw ConfigError("compare: --set " + o + ": no strategy of --strategies has the key " +
                        strategy_key(o) + " (`ztrain plugins` lists each one's keys)");
    if (t.size() < a.strategies.size()) {
      std::string names;
      for (const auto& n : t) names += (names.empty() ? "" : ", ") + n;
      os << "note: --set " << o << " goes to " << names
         << " alone (the other strategies have no such key)\n";
    }
  }
  return overrides;
}

// What the page says was run: the model and its size, the data (the
// first job's resolved [data] table), precision, ranks, device, where and
// when, and the command.
html::Facts run_facts(const CompareArgs& a, const RunConfig& config, const Comparison& c,
                      const std::string& device, const fs::path& out) {
  std::string model = config.plugin("model", "transformer");
  try {
    // The run's own [strategy] without the overrides that went to some
    // jobs only (check_strategies), which it may not have.
    TrainArgs run = a.run;
    std::erase_if(run.overrides, [](const std::string& o) { return !strategy_key(o).empty(); });
    const RunParts parts = make_run_parts(load_run_config(run),
                                          PluginLoader(default_plugin_dirs(a.run.plugin_paths), {}),
                                          {a.nproc, a.nproc, 0});
    model += " " + parts.info.arch + ", " + format_rate(static_cast<double>(parts.info.n_params)) +
             " parameters";
  } catch (const Error& e) {
    model += " (size unknown: " + std::string(e.what()) + ")";
  }
  std::string data = config.plugin("data", "synthetic");
  for (const auto& j : c.jobs)
    if (fs::exists(out / j.strategy / "config.toml")) {
      data = config_section_summary(out / j.strategy / "config.toml", "data");
      break;
    }
  html::Facts facts = html::machine_facts(a.command_line);
  facts.insert(facts.begin() + 1,
               {{"run", c.run_file + ", " + counted(c.steps, "step") + " per job"},
                {"model", model},
                {"data", data},
                {"precision", c.precision},
                {"ranks", std::to_string(c.ranks) + " per job" +
                              (c.mesh.empty() ? "" : ", on the mesh " + c.mesh)},
                {"device", device}});
  return facts;
}

// The degrees that split the model's work, in words: "tensor 2 x
// sequence 2"; empty when every rank holds the whole model and sequences.
std::string mesh_words(const ParallelSettings& p) {
  std::string out;
  for (const auto& [name, degree] : {std::pair{"tensor", p.tensor},
                                     {"sequence", p.sequence},
                                     {"context", p.context},
                                     {"pipeline", p.pipeline}})
    if (degree > 1)
      out += (out.empty() ? "" : " x ") + std::string(name) + " " + std::to_string(degree);
  if (p.tensor_sequence) out += " (tensor_sequence)";
  if (p.pipeline > 1)
    out += " (" + p.pipeline_schedule +
           (p.pipeline_chunks > 1 ? ", " + std::to_string(p.pipeline_chunks) + " chunks"
                                  : std::string()) +
           ")";
  return out;
}

}  // namespace

int compare(const CompareArgs& a, std::ostream& os) {
  check_args(a);
  // The run file loads here first, so a bad one fails once, not per job.
  const RunConfig config = load_run_config(a.run);
  const std::vector<std::vector<std::string>> overrides = check_strategies(a, os);
  const RunSettings settings = resolve_settings(config, a.nproc);
  Comparison c;
  c.run_file = a.run.config.string();
  c.precision = precision_label(settings.train.precision);
  c.ranks = a.nproc;
  c.steps = a.steps.value_or(settings.train.steps);
  c.mesh = mesh_words(settings.parallel);
  c.tolerance = tolerance_for(c.precision);
  const fs::path out = a.out_dir.empty() ? fs::path("runs/compare") : a.out_dir;
  if (fs::exists(out / "compare.json") && !a.run.overwrite)
    throw ConfigError("'" + out.string() +
                      "' holds an earlier comparison; give another --out or --overwrite");
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw ConfigError("cannot create '" + out.string() + "': " + ec.message());
  for (std::size_t i = 0; i < a.strategies.size(); ++i)
    c.jobs.push_back(run_job(a, a.strategies[i], overrides[i], i, c.steps, out, os));
  c.verdict = equivalence(c.jobs, c.tolerance);
  c.device_limit = settings.device.memory_limit;
  c.facts = run_facts(a, config, c, settings.device.kind, out);
  write_file_atomically(out / "compare.csv", comparison_csv(c));
  write_file_atomically(out / "compare.json", comparison_json(c));
  write_file_atomically(out / "compare.html", comparison_html(c));
  os << "\n" << comparison_table(c);
  os << "written: " << (out / "compare.csv").string() << ", " << (out / "compare.json").string()
     << ", " << (out / "compare.html").string() << "\n";
  bool failed = !c.verdict.equivalent;
  for (const auto& j : c.jobs) failed = failed || j.outcome == JobOutcome::failed;
  return failed ? 1 : 0;
}

}  // namespace ztrain
