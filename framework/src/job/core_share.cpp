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

// Why a host's ranks that may use the same CPUs stay unbound; "" when
// they are bound. `threads`: each rank's kernel threads.
std::string why_unbound(const std::vector<std::size_t>& mine, const std::vector<int>& threads,
                        std::size_t cpus, std::size_t cores, CoreBinding binding) {
  if (binding == CoreBinding::off) return "[device] bind_cores = \"off\"";
  if (cores < mine.size()) return plural(cores, "core");
  std::size_t used = 0;
  for (std::size_t r : mine) used += static_cast<std::size_t>(threads[r]);
  // Threads the plan gives fill the CPUs but for a remainder of fewer
  // than one per rank: they count as filling.
  if (binding == CoreBinding::automatic && used + mine.size() <= cpus)
    return "their " + plural(used, "kernel thread") + " leave " + std::to_string(cpus - used) +
           " of " + plural(cpus, "CPU") + " to other jobs; [device] bind_cores = \"on\" binds them";
  return "";
}

// Each of a host's ranks bound to an even share of its cores, in order:
// their CPUs and threads into s; returns the shares' text.
std::string bind_evenly(const std::vector<std::vector<int>>& cores,
                        const std::vector<std::size_t>& mine, CoreShares& s) {
  const std::size_t per = cores.size() / mine.size();
  std::string text =
      " bound to " + std::to_string(per) + " of " + plural(cores.size(), "core") + " each (CPUs ";
  for (std::size_t i = 0; i < mine.size(); ++i) {
    std::vector<int>& own = s.cpus[mine[i]];
    for (std::size_t c = i * per; c < (i + 1) * per; ++c)
      own.insert(own.end(), cores[c].begin(), cores[c].end());
    s.threads[mine[i]] = static_cast<int>(own.size());
    text += (i ? " | " : "") + cpu_list_text(own);
  }
  return text + ")";
}

// One host's ranks (their numbers, in rank order, two or more): their
// CPUs and threads into s; returns what was decided, for the header.
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
  std::vector<int> threads(ranks.size());
  for (std::size_t r : mine) {
    s.threads[r] = even_threads(allowed, mine.size());
    threads[r] = ranks[r].threads > 0 ? ranks[r].threads : s.threads[r];
  }
  const std::vector<std::vector<int>> cores = physical_cores(allowed);
  const std::string why = why_unbound(mine, threads, allowed.size(), cores.size(), binding);
  return why.empty() ? who + bind_evenly(cores, mine, s) : who + " not bound (" + why + ")";
}

}  // namespace

// One exchange: each rank's "HOST\nTHREADS CPU:PACKAGE:CORE ...".
std::vector<RankCpus> gather_rank_cpus(int threads, Communicator& comm) {
  std::ostringstream mine;
  mine << host_name() << '\n' << threads;
  for (const CpuSlot& s : allowed_cpus()) mine << ' ' << s.cpu << ':' << s.package << ':' << s.core;
  std::vector<RankCpus> ranks;
  for (const std::string& text : every_rank_text(mine.str(), comm)) {
    const std::size_t cut = text.find('\n');
    RankCpus rank{text.substr(0, cut), 0, {}};
    std::istringstream in(text.substr(cut + 1));
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
