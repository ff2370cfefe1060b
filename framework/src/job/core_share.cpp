#include "job/core_share.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <utility>

#include "core/host_name.h"
#include "job/rank_agreement.h"

namespace ztrain {
namespace {

bool same_cpus(const std::vector<CpuSlot>& a, const std::vector<CpuSlot>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const CpuSlot& x, const CpuSlot& y) { return x.cpu == y.cpu; });
}

// The host's physical cores in (package, core) order, each its CPUs.
std::vector<std::vector<int>> physical_cores(const std::vector<CpuSlot>& allowed) {
  std::map<std::pair<int, int>, std::vector<int>> cores;
  for (const CpuSlot& s : allowed) cores[{s.package, s.core}].push_back(s.cpu);
  std::vector<std::vector<int>> ordered;
  for (auto& [where, cpus] : cores) ordered.push_back(std::move(cpus));
  return ordered;
}

std::string plural(std::size_t n, const std::string& what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

// The kernel threads of a rank that leaves them to the plan: the host's
// allowed CPUs split among its ranks (at least 1).
int even_threads(const std::vector<CpuSlot>& allowed, std::size_t ranks) {
  return std::max(1, static_cast<int>(allowed.size() / ranks));
}

// One host's ranks (their numbers, in rank order, two or more): each
// rank's CPUs into s.cpus where they are bound, its threads into
// s.threads; returns what was decided, for the header.
std::string share_host(const std::vector<RankCpus>& ranks, const std::vector<std::size_t>& mine,
                       CoreBinding binding, CoreShares& s) {
  const std::string who = "host " + ranks[mine[0]].host + ": " + plural(mine.size(), "rank");
  const std::vector<CpuSlot>& allowed = ranks[mine[0]].allowed;
  for (std::size_t r : mine)
    if (!same_cpus(ranks[r].allowed, allowed)) {
      for (std::size_t q : mine)
        s.threads[q] = std::max(1, static_cast<int>(ranks[q].allowed.size()));
      return who + " not bound (their launcher gave them different CPUs; kept)";
    }
  for (std::size_t r : mine) s.threads[r] = even_threads(allowed, mine.size());
  if (binding == CoreBinding::off) return who + " not bound ([device] bind_cores = \"off\")";
  const std::vector<std::vector<int>> cores = physical_cores(allowed);
  if (cores.size() < mine.size()) return who + " not bound (" + plural(cores.size(), "core") + ")";
  std::size_t threads = 0;
  for (std::size_t r : mine)
    threads += static_cast<std::size_t>(ranks[r].threads > 0 ? ranks[r].threads : s.threads[r]);
  // Threads the plan gives fill the CPUs but for a remainder of fewer
  // than one per rank: they count as filling.
  const bool fills = threads + mine.size() > allowed.size();
  if (binding == CoreBinding::automatic && !fills)
    return who + " not bound (their " + plural(threads, "kernel thread") + " leave " +
           std::to_string(allowed.size() - threads) + " of " + plural(allowed.size(), "CPU") +
           " to other jobs; [device] bind_cores = \"on\" binds them)";
  const std::size_t per = cores.size() / mine.size();
  std::string text = who + " bound to " + std::to_string(per) + " of " +
                     plural(cores.size(), "core") + " each (CPUs ";
  for (std::size_t i = 0; i < mine.size(); ++i) {
    std::vector<int>& own = s.cpus[mine[i]];
    for (std::size_t c = i * per; c < (i + 1) * per; ++c)
      own.insert(own.end(), cores[c].begin(), cores[c].end());
    s.threads[mine[i]] = static_cast<int>(own.size());
    text += (i ? " | " : "") + cpu_list_text(own);
  }
  return text + ")";
}

}  // namespace

std::vector<RankCpus> gather_rank_cpus(int threads, Communicator& comm) {
  std::ostringstream mine;
  mine << threads;
  for (const CpuSlot& s : allowed_cpus()) mine << ' ' << s.cpu << ':' << s.package << ':' << s.core;
  std::vector<RankCpus> ranks;
  const std::vector<std::string> hosts = every_rank_text(host_name(), comm);
  const std::vector<std::string> texts = every_rank_text(mine.str(), comm);
  for (std::size_t r = 0; r < texts.size(); ++r) {
    RankCpus rank{hosts[r], 0, {}};
    std::istringstream in(texts[r]);
    in >> rank.threads;
    CpuSlot s;
    char colon = 0;
    while (in >> s.cpu >> colon >> s.package >> colon >> s.core) rank.allowed.push_back(s);
    ranks.push_back(std::move(rank));
  }
  return ranks;
}

CoreShares plan_core_shares(const std::vector<RankCpus>& ranks, CoreBinding binding) {
  CoreShares shares;
  shares.cpus.resize(ranks.size());
  shares.threads.resize(ranks.size());
  for (std::size_t r = 0; r < ranks.size(); ++r)
    shares.threads[r] = even_threads(ranks[r].allowed, 1);
  std::vector<std::string> hosts;
  std::map<std::string, std::vector<std::size_t>> on_host;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (on_host[ranks[r].host].empty()) hosts.push_back(ranks[r].host);
    on_host[ranks[r].host].push_back(r);
  }
  for (const std::string& host : hosts) {
    if (on_host[host].size() < 2) continue;
    const std::string text = share_host(ranks, on_host[host], binding, shares);
    shares.text += (shares.text.empty() ? "" : " | ") + text;
  }
  return shares;
}

}  // namespace ztrain
