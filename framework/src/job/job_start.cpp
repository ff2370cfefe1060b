// Rank 0's run travels as one JSON text: {"run": RunConfig::to_wire(),
// "overwrite": bool} when it read the run, {"error": message, "config":
// bool, "host": name} when it could not (rank_0_text carries it).
#include "job/job_start.h"

#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "comm/shm_communicator.h"
#include "comm/world.h"
#include "core/host_name.h"
#include "job/rank_agreement.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

using json = nlohmann::json;

// What rank 0 made of the run: the configuration, or the error it raised.
struct RankZeroRun {
  std::optional<RunConfig> config;
  std::exception_ptr error;
  std::string message;
  bool config_error = false;
};

RankZeroRun read_on_rank_0(const std::function<RunConfig()>& read_run) {
  RankZeroRun r;
  try {
    r.config = read_run();
    resolve_comm(*r.config);  // a bad [comm] section is the run's error too
  } catch (const std::exception& e) {
    r.config.reset();
    r.error = std::current_exception();
    r.message = e.what();
    r.config_error = dynamic_cast<const ConfigError*>(&e) != nullptr;
  }
  return r;
}

std::string wire_of(const RankZeroRun& r, bool overwrite) {
  if (!r.config)
    return json{{"error", r.message}, {"config", r.config_error}, {"host", host_name()}}.dump();
  return json{{"run", r.config->to_wire()}, {"overwrite", overwrite}}.dump();
}

// The launcher decides the backend; a [comm] backend naming another one
// would have made a job of a different shape (a world of one per rank).
void check_backend(const RunConfig& config, const Communicator& comm) {
  const std::string asked = resolve_comm(config).backend;
  // nccl rides on the launcher's communicator (which carries its id).
  if (asked == "auto" || asked == "nccl" || asked == comm.backend() ||
      (asked == "local" && comm.size() == 1))
    return;
  throw ConfigError(config.where("comm.backend") + ": [comm] backend \"" + asked +
                    "\", but this process was started " +
                    (launched_by_mpi() ? "by an MPI launcher" : "with RANK and WORLD_SIZE") +
                    " as one of " + std::to_string(comm.size()) + " ranks, which meet through " +
                    comm.backend() + "; set backend = \"auto\" or \"" + comm.backend() + "\"");
}

}  // namespace

std::unique_ptr<Communicator> make_communicator(const CommSettings& c) {
  if (c.backend == "local") return make_local_communicator();
  if (c.backend == "mpi") return make_mpi_communicator(c.timeout_s);
  if (c.backend == "gloo") return make_gloo_communicator(c.timeout_s);
  // auto (and nccl, which needs one of these to carry its id): whoever
  // started this process says how the ranks meet.
  if (launched_by_mpi()) return make_mpi_communicator(c.timeout_s);
  if (launched_by_env()) return make_gloo_communicator(c.timeout_s);
  return make_local_communicator();
}

JobStart start_job(const std::function<RunConfig()>& read_run, bool overwrite) {
  if (!launched_by_mpi() && !launched_by_env()) {
    RunConfig config = read_run();
    auto comm = make_communicator(resolve_comm(config));
    return {std::move(comm), std::move(config), overwrite};
  }
  std::optional<RankZeroRun> mine;
  if (launcher_rank() == 0) mine = read_on_rank_0(read_run);
  const double meeting_timeout = mine && mine->config
                                     ? resolve_comm(*mine->config).timeout_s
                                     : resolve_comm(RunConfig::parse("", "defaults")).timeout_s;
  std::unique_ptr<Communicator> comm = launched_by_mpi() ? make_mpi_communicator(meeting_timeout)
                                                         : make_gloo_communicator(meeting_timeout);
  const bool lead = comm->rank() == 0;
  // The launcher's rank variable may name another rank than the meeting.
  if (lead && !mine) mine = read_on_rank_0(read_run);
  std::string wire_text;
  try {
    wire_text = rank_0_text(lead ? wire_of(*mine, overwrite) : "", *comm);
  } catch (const CommError& e) {
    throw CommError(std::string(e.what()) + " (while rank 0 sent the run to every rank)");
  }
  const json wire = json::parse(wire_text);
  if (wire.contains("error")) {
    if (lead) std::rethrow_exception(mine->error);
    const std::string why = "rank 0 (host " + wire.at("host").get<std::string>() +
                            ") cannot read the run: " + wire.at("error").get<std::string>();
    if (wire.at("config").get<bool>()) throw ConfigError(why);
    throw Error(why);
  }
  JobStart job{
      std::move(comm),
      lead ? std::move(*mine->config) : RunConfig::from_wire(wire.at("run").get<std::string>()),
      wire.at("overwrite").get<bool>()};
  const CommSettings settings = resolve_comm(job.config);
  job.comm->set_timeout(settings.timeout_s);
  check_backend(job.config, *job.comm);
  if (settings.shared_memory) job.comm = share_memory(std::move(job.comm), settings.timeout_s);
  if (lead && job.comm->size() > 1)
    job.config.add_note(shares_memory(*job.comm)
                            ? "comm: every rank is on this host: collectives through shared "
                              "memory ([comm] shared_memory)"
                            : "comm: collectives through " + job.comm->backend() +
                                  (settings.shared_memory ? " (the ranks are not all on one host)"
                                                          : " ([comm] shared_memory = false)"));
  if (lead && job.comm->size() > 1)
    job.config.add_note("run: read by rank 0 on host " + host_name() + ", sent to " +
                        std::to_string(job.comm->size() - 1) + " other rank" +
                        (job.comm->size() > 2 ? "s" : "") + " (" +
                        std::to_string(wire_text.size()) + " bytes)");
  return job;
}

}  // namespace ztrain
