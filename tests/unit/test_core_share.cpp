// Ranks sharing a host on cores of their own (job/core_share.h): the
// plan's shares over many host shapes (disjoint, equal, hyperthreads of a
// core together, inside the CPUs allowed), the cases left to the
// scheduler and what the header says for each; binding every thread of
// this process (job/cpu_affinity.h) checked on real threads.
#include <doctest/doctest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>

#include "job/core_share.h"
#include "job/cpu_affinity.h"

using namespace ztrain;

namespace {

// A host of `packages` packages, `cores` cores each and `smt` threads a
// core, numbered as Linux does: first every core's first thread, package
// by package, then the second threads in the same order. Core ids restart
// in each package, as sysfs has them.
std::vector<CpuSlot> host(int packages, int cores, int smt) {
  std::vector<CpuSlot> slots;
  for (int t = 0; t < smt; ++t)
    for (int p = 0; p < packages; ++p)
      for (int c = 0; c < cores; ++c) slots.push_back({t * packages * cores + p * cores + c, p, c});
  std::sort(slots.begin(), slots.end(), [](auto& a, auto& b) { return a.cpu < b.cpu; });
  return slots;
}

std::vector<RankCpus> ranks_on(const std::string& name, int n, int threads,
                               const std::vector<CpuSlot>& cpus) {
  return std::vector<RankCpus>(static_cast<std::size_t>(n), RankCpus{name, threads, cpus});
}

bool contains(const std::string& s, const std::string& part) {
  INFO("text: " << s);
  return s.find(part) != std::string::npos;
}

// The properties every binding has on a host whose ranks are `rs` (all
// bound): shares disjoint, of one size, inside the allowed CPUs, whole
// physical cores each, and together as many cores as fit evenly.
void check_shares(const CoreShares& s, const std::vector<std::size_t>& rs,
                  const std::vector<CpuSlot>& allowed) {
  std::set<int> taken;
  std::set<std::pair<int, int>> cores_taken;
  const std::size_t size = s.cpus[rs[0]].size();
  for (std::size_t r : rs) {
    INFO("rank " << r);
    CHECK(s.cpus[r].size() == size);
    std::set<std::pair<int, int>> mine;
    for (int cpu : s.cpus[r]) {
      CHECK(taken.insert(cpu).second);
      const auto at = std::find_if(allowed.begin(), allowed.end(),
                                   [&](const CpuSlot& c) { return c.cpu == cpu; });
      REQUIRE(at != allowed.end());
      mine.insert({at->package, at->core});
    }
    for (const auto& core : mine) {
      CHECK(cores_taken.insert(core).second);
      for (const CpuSlot& c : allowed)  // every thread of the core is in the share
        if (c.package == core.first && c.core == core.second)
          CHECK(std::count(s.cpus[r].begin(), s.cpus[r].end(), c.cpu) == 1);
    }
  }
  std::set<std::pair<int, int>> all;
  for (const CpuSlot& c : allowed) all.insert({c.package, c.core});
  CHECK(cores_taken.size() == all.size() / rs.size() * rs.size());
}

std::vector<std::size_t> first_n(std::size_t n) {
  std::vector<std::size_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

}  // namespace

TEST_CASE("core shares: two ranks on two cores get one each, as the header says") {
  for (int threads : {0, 1}) {  // the plan's threads, or set to 1
    const CoreShares s =
        plan_core_shares(ranks_on("vm", 2, threads, host(1, 2, 1)), CoreBinding::automatic);
    CHECK(s.cpus[0] == std::vector<int>{0});
    CHECK(s.cpus[1] == std::vector<int>{1});
    CHECK(s.threads == std::vector<int>{1, 1});
    CHECK(s.text == "host vm: 2 ranks bound to 1 of 2 cores each (CPUs 0 | 1)");
  }
}

TEST_CASE("core shares: a rank alone on its host keeps every CPU for its threads") {
  const CoreShares s = plan_core_shares(ranks_on("h", 1, 0, host(1, 6, 2)), CoreBinding::on);
  CHECK(s.cpus[0].empty());
  CHECK(s.threads == std::vector<int>{12});
  CHECK(s.text.empty());
}

TEST_CASE("core shares: a package's cores and their hyperthreads go to one rank") {
  // 2 packages x 4 cores x 2 threads: rank 0 package 0's CPUs 0-3 and
  // their siblings 8-11, rank 1 package 1's.
  const CoreShares s = plan_core_shares(ranks_on("h", 2, 8, host(2, 4, 2)), CoreBinding::automatic);
  std::vector<int> a = s.cpus[0], b = s.cpus[1];
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  CHECK(a == std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(b == std::vector<int>{4, 5, 6, 7, 12, 13, 14, 15});
  CHECK(s.threads == std::vector<int>{8, 8});
  CHECK(contains(s.text, "(CPUs 0-3,8-11 | 4-7,12-15)"));
}

TEST_CASE("core shares: every host shape and rank count splits into equal, disjoint cores") {
  for (int packages : {1, 2})
    for (int cores : {1, 2, 3, 6, 8})
      for (int smt : {1, 2})
        for (int n = 2; n <= 8; ++n) {
          const std::vector<CpuSlot> cpus = host(packages, cores, smt);
          // The plan's threads on even shapes, else set to fill the CPUs.
          const int cpu_count = packages * cores * smt;
          const int threads = cpu_count % n == 0 ? 0 : (cpu_count + n - 1) / n;
          CAPTURE(packages);
          CAPTURE(cores);
          CAPTURE(smt);
          CAPTURE(n);
          const CoreShares s =
              plan_core_shares(ranks_on("h", n, threads, cpus), CoreBinding::automatic);
          if (packages * cores < n) {
            for (const auto& c : s.cpus) CHECK(c.empty());
            const int c = packages * cores;
            CHECK(contains(s.text,
                           "not bound (" + std::to_string(c) + (c == 1 ? " core)" : " cores)")));
            for (int t : s.threads) CHECK(t == std::max(1, cpu_count / n));
          } else {
            check_shares(s, first_n(static_cast<std::size_t>(n)), cpus);
            for (std::size_t r = 0; r < s.cpus.size(); ++r)
              CHECK(s.threads[r] == static_cast<int>(s.cpus[r].size()));
          }
        }
}

TEST_CASE("core shares: threads that leave CPUs free are not bound unless asked") {
  const auto ranks = ranks_on("h", 2, 1, host(1, 8, 1));
  const CoreShares left = plan_core_shares(ranks, CoreBinding::automatic);
  for (const auto& c : left.cpus) CHECK(c.empty());
  CHECK(contains(left.text, "not bound (their 2 kernel threads leave 6 of 8 CPUs to other jobs"));
  const CoreShares on = plan_core_shares(ranks, CoreBinding::on);
  check_shares(on, {0, 1}, host(1, 8, 1));
  CHECK(on.cpus[0] == std::vector<int>{0, 1, 2, 3});
  const CoreShares off = plan_core_shares(ranks_on("h", 2, 0, host(1, 8, 1)), CoreBinding::off);
  for (const auto& c : off.cpus) CHECK(c.empty());
  CHECK(off.threads == std::vector<int>{4, 4});
  CHECK(contains(off.text, "bind_cores = \"off\""));
}

TEST_CASE("core shares: a launcher's own binding is kept") {
  // As Open MPI's --bind-to socket would: each rank its package's CPUs,
  // every one of them for its threads.
  std::vector<RankCpus> ranks = ranks_on("h", 2, 0, host(2, 2, 1));
  ranks[0].allowed.resize(2);
  ranks[1].allowed.erase(ranks[1].allowed.begin(), ranks[1].allowed.begin() + 2);
  const CoreShares s = plan_core_shares(ranks, CoreBinding::on);
  for (const auto& c : s.cpus) CHECK(c.empty());
  CHECK(s.threads == std::vector<int>{2, 2});
  CHECK(contains(s.text, "launcher gave them different CPUs"));
}

TEST_CASE("core shares: each host on its own, by name, and a host of one rank untouched") {
  // Hosts a, b, a, b, c: a's ranks 0 and 2 share a's cores, b's 1 and 3
  // share b's (the same CPU numbers on another machine), c's one rank is
  // left as it is and not said.
  std::vector<RankCpus> ranks;
  for (const char* name : {"a", "b", "a", "b", "c"}) ranks.push_back({name, 2, host(1, 4, 1)});
  const CoreShares s = plan_core_shares(ranks, CoreBinding::automatic);
  check_shares(s, {0, 2}, host(1, 4, 1));
  check_shares(s, {1, 3}, host(1, 4, 1));
  CHECK(s.cpus[0] == std::vector<int>{0, 1});
  CHECK(s.cpus[2] == std::vector<int>{2, 3});
  CHECK(s.cpus[4].empty());
  CHECK(s.text ==
        "host a: 2 ranks bound to 2 of 4 cores each (CPUs 0-1 | 2-3) | host b: 2 ranks bound to "
        "2 of 4 cores each (CPUs 0-1 | 2-3)");
  CHECK(plan_core_shares(ranks_on("h", 1, 4, host(1, 4, 1)), CoreBinding::on).text.empty());
}

TEST_CASE("cpu lists are written as the kernel writes them") {
  CHECK(cpu_list_text({8, 0, 2, 1, 3}) == "0-3,8");
  CHECK(cpu_list_text({5}) == "5");
  CHECK(cpu_list_text({1, 3, 5}) == "1,3,5");
}

namespace {

std::set<int> affinity_of(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(tid, sizeof set, &set) == 0);
  std::set<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.insert(c);
  return cpus;
}

}  // namespace

TEST_CASE("binding the process binds every thread it has, and threads started later") {
  const std::vector<CpuSlot> allowed = allowed_cpus();
  REQUIRE(!allowed.empty());
  std::vector<int> before;
  for (const CpuSlot& c : allowed) before.push_back(c.cpu);
  CHECK(affinity_of(0) == std::set<int>(before.begin(), before.end()));

  std::atomic<pid_t> other{0};
  std::atomic<bool> done{false};
  std::thread waiting([&] {
    other = static_cast<pid_t>(::syscall(SYS_gettid));
    while (!done) std::this_thread::yield();
  });
  while (other == 0) std::this_thread::yield();
  const int last = before.back();
  CHECK(bind_process({last}) == "");
  CHECK(affinity_of(0) == std::set<int>{last});
  CHECK(affinity_of(other) == std::set<int>{last});
  std::set<int> later_cpus;
  std::thread probe([&] { later_cpus = affinity_of(0); });
  probe.join();
  CHECK(later_cpus == std::set<int>{last});
  done = true;
  waiting.join();
  CHECK(bind_process(before) == "");
  CHECK(affinity_of(0) == std::set<int>(before.begin(), before.end()));
}
