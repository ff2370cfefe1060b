// bench_comm: the collectives the strategies use, timed on this job's world
// communicator: MPI when started by mpirun, gloo when started torchrun-style
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; bench/bench_launch.sh starts
// both), through a shared-memory segment as a run's ranks on one host are
// (shm_communicator.h), or with --shared-memory 0 through the backend's own
// transport. For each size, all_reduce, reduce_scatter and all_gather of fp32
// are timed (median of --reps, the slowest rank's) and printed as seconds
// and bus bandwidth: the bytes a ring moves per rank, 2 (N-1)/N of the
// buffer for all_reduce and (N-1)/N for the others, over the time, which
// makes the three and both backends comparable (NCCL's busbw).
//
//   bench_comm [--sizes 262144,4194304,33554432] [--reps 7] [--shared-memory 1]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "comm/shm_communicator.h"
#include "comm/world.h"
#include "stopwatch.h"
#include "ztrain/comm.h"

using namespace ztrain;
using bench::median;
using bench::timed;

namespace {

struct Args {
  std::vector<std::size_t> sizes{262144, 4194304, 33554432};
  int reps = 7;
  bool shared_memory = true;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    if (key == "--reps") {
      a.reps = std::atoi(argv[i + 1]);
    } else if (key == "--shared-memory") {
      a.shared_memory = std::string(argv[i + 1]) != "0";
    } else if (key == "--sizes") {
      a.sizes.clear();
      std::stringstream list(argv[i + 1]);
      for (std::string item; std::getline(list, item, ',');)
        a.sizes.push_back(static_cast<std::size_t>(std::stod(item)));
    } else {
      std::fprintf(stderr, "bench_comm: unknown option %s (--sizes, --reps, --shared-memory)\n",
                   key.c_str());
      std::exit(2);
    }
  }
  return a;
}

// The slowest rank's median time of f over reps calls, after one warm-up.
template <class F>
double slowest_median(Communicator& comm, int reps, F&& f) {
  f();
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    comm.barrier();
    times.push_back(timed(f));
  }
  double t = median(times);
  std::vector<float> all(static_cast<std::size_t>(comm.size()));
  const float mine = static_cast<float>(t);
  comm.all_gather(&mine, all.data(), 1, DType::f32);
  return *std::max_element(all.begin(), all.end());
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  std::unique_ptr<Communicator> comm =
      launched_by_mpi() ? make_mpi_communicator(300) : make_gloo_communicator(300);
  if (args.shared_memory) comm = share_memory(std::move(comm), 300);
  const auto n = static_cast<std::size_t>(comm->size());
  const double ring = static_cast<double>(n - 1) / static_cast<double>(n);
  if (comm->rank() == 0)
    std::printf(
        "%s%s, %zu ranks: fp32, median of %d, the slowest rank's; bus GB/s = ring "
        "bytes per rank / time\n%-15s %12s %10s %9s\n",
        comm->backend().c_str(), shares_memory(*comm) ? " (shared memory)" : "", n, args.reps,
        "collective", "elements", "time (ms)", "bus GB/s");
  for (const std::size_t count : args.sizes) {
    const std::size_t block = count / n;
    std::vector<float> buffer(count, 1.0f), part(block, 0.0f);
    const double bytes = 4.0 * static_cast<double>(block * n);
    const struct {
      const char* name;
      double ring_bytes;
      double seconds;
    } rows[] = {
        {"all_reduce", 2 * ring * bytes,
         slowest_median(
             *comm, args.reps,
             [&] { comm->all_reduce(buffer.data(), block * n, DType::f32, ReduceOp::sum); })},
        {"reduce_scatter", ring * bytes,
         slowest_median(*comm, args.reps,
                        [&] {
                          comm->reduce_scatter(buffer.data(), part.data(), block, DType::f32,
                                               ReduceOp::sum);
                        })},
        {"all_gather", ring * bytes,
         slowest_median(*comm, args.reps,
                        [&] { comm->all_gather(part.data(), buffer.data(), block, DType::f32); })},
    };
    if (comm->rank() == 0)
      for (const auto& row : rows)
        std::printf("%-15s %12zu %10.3f %9.2f\n", row.name, block * n, row.seconds * 1e3,
                    row.ring_bytes / row.seconds / 1e9);
  }
  return 0;
}
