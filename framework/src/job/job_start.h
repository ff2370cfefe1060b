// How the ranks of a job meet and learn what to run.
//
// Only rank 0 reads the run: the run file, the presets it names, the --set
// overrides and the DeepSpeed config. The ranks meet (the launcher says
// how: mpirun or the RANK/WORLD_SIZE environment), then rank 0 sends the
// resolved configuration, with the origin of every value so that errors
// still name file:line:col, to every other rank. The other hosts need no
// copy of those files, and no rank can run another configuration: what the
// other ranks were given on their command lines (or in their files) is not
// read. When rank 0 cannot read the run, every rank stops with its error.
//
// Rank 0 reads the run before the ranks meet, so that its wait for them
// keeps the run's [comm] timeout; the others wait with the default timeout
// (they learn the run's only from rank 0) and set the run's once it came.
//
// Thread safety: start_job is called once, by the training thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "config/config.h"
#include "config/run_settings.h"
#include "ztrain/comm.h"

namespace ztrain {

struct JobStart {
  std::unique_ptr<Communicator> comm;
  RunConfig config;        // rank 0's; it also has a note on how the run travelled
  bool overwrite = false;  // rank 0's --overwrite
};

// read_run reads the run on rank 0 (it may raise ConfigError or Error);
// overwrite is this process's --overwrite. A process that no launcher
// started reads the run itself and makes the communicator its [comm]
// section asks for. Raises rank 0's error on every rank when it cannot
// read the run, and ConfigError when [comm] backend names another backend
// than the launcher's.
JobStart start_job(const std::function<RunConfig()>& read_run, bool overwrite);

// The communicator a [comm] section asks for ("auto": the launcher's), for
// a process that has its configuration without rank 0 (no launcher, tests).
std::unique_ptr<Communicator> make_communicator(const CommSettings& settings);

}  // namespace ztrain
