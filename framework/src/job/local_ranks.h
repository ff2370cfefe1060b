// One machine's share of a multi-machine job, started as torchrun starts
// its workers: one process per local rank, each with the variables a
// torchrun-style rank reads (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), meeting the other machines'
// ranks at MASTER_ADDR:MASTER_PORT (comm/world.h, make_gloo_communicator).
//
// local_rank_env is the plan, a pure function; run_local_ranks carries it
// out and supervises: the ranks form one process group of their own, so
// SIGINT, SIGTERM and SIGHUP reach them once, passed on by this process
// (a terminal's Ctrl-C included, which reaches only this one); when a rank
// fails, the others are stopped (SIGTERM, then SIGKILL after `grace`), as
// torchrun stops a failed worker group, so no rank is left waiting on a
// dead one.
//
// Errors: Error when a process cannot start (the ones started are
// stopped first). Thread safety: run_local_ranks owns the process's
// signal handlers while it runs; call it from the main thread, once.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace ztrain {

struct MachineShare {
  int machine_rank = 0;  // this machine's place
  int per_machine = 1;   // ranks on each machine
  int machines = 1;
  std::string main_addr;  // where rank 0 listens
  int main_port = 29500;
};

// The environment additions of each local rank, "NAME=value", local rank
// order: rank = machine_rank * per_machine + local rank.
std::vector<std::vector<std::string>> local_rank_env(const MachineShare& share);

// Starts `command` once per entry of env (each with its additions over
// this process's environment), waits for all; returns 0 when every rank
// exits 0, else the first failure's status (128 + signal for a rank a
// signal ended).
int run_local_ranks(const std::vector<std::string>& command,
                    const std::vector<std::vector<std::string>>& env,
                    std::chrono::seconds grace = std::chrono::seconds(30));

}  // namespace ztrain
