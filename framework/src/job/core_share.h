// Which CPUs each rank of a job runs on. Ranks that share a host and
// between them run a kernel thread on every CPU they may use get cores of
// their own: the host's physical cores (SMT siblings together), in
// package and core order, split evenly in the ranks' order on the host.
// Unbound, the scheduler now and then puts two ranks' compute threads on
// one core for several steps while another stands idle, and every rank
// waits for the slow one at the next collective (docs/decisions.md, "Each
// rank its own cores", has the figures).
//
// A host is left to the scheduler when its ranks' threads leave CPUs
// free (another job may be using them: binding two such jobs would stack
// both on the first cores), when the launcher gave the ranks different
// CPUs (it bound them already), when it has more ranks than cores, when
// it has one rank, and when [device] bind_cores is "off"; "on" binds even
// ranks that leave CPUs free. The plan also gives each rank its kernel
// threads where [device] threads leaves them to it: its share's CPUs when
// bound, all it may use when its launcher bound it, else the host's
// allowed CPUs split among its ranks. The plan is pure: every rank
// computes it from every rank's CPUs and applies its own line, so the
// header's text is the same on all of them.
//
// Thread safety: plan_core_shares anywhere; gather_rank_cpus is
// collective (every rank calls it; the training thread).
// Errors: none; a refused binding is the caller's warning
// (job/cpu_affinity.h).
#pragma once

#include <string>
#include <vector>

#include "job/cpu_affinity.h"
#include "ztrain/comm.h"

namespace ztrain {

// One rank's host, its kernel threads as [device] threads sets them (0:
// the plan's) and the CPUs it may use.
struct RankCpus {
  std::string host;
  int threads = 0;
  std::vector<CpuSlot> allowed;
};

enum class CoreBinding { automatic, on, off };

// Every rank's CPUs (each rank's [device] threads and allowed_cpus()),
// in rank order, on every rank.
std::vector<RankCpus> gather_rank_cpus(int threads, Communicator& comm);

struct CoreShares {
  std::vector<std::vector<int>> cpus;  // per rank, the CPUs to bind it to; empty: left as it is
  std::vector<int> threads;            // per rank, its kernel threads (at least 1)
  std::string text;                    // per host, what was decided and why; "" for one rank
};

CoreShares plan_core_shares(const std::vector<RankCpus>& ranks, CoreBinding binding);

}  // namespace ztrain
