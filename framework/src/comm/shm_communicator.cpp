// The segment: a header (nonce, ranks), one cache line per rank holding the
// count of barriers it has reached, then two sets of one slot per rank.
//
// Every collective is a run of chunks, and every chunk writes the ranks'
// slots of one set, meets at a barrier, then reads them; the next chunk uses
// the other set. A rank writes a set again only two chunks later, after a
// barrier every rank reached once it had finished reading that set, so one
// barrier per phase is all the ordering there is (all-reduce has two
// phases: it sums in place in rank 0's slot, then everyone copies out).
// The chunk counter runs on across collectives, so the parity does too.
//
// A barrier stores this rank's count (release) and waits for every other
// rank's to reach it (acquire): a short spin, then a futex wait on the low
// half of the peer's 64-bit count (the segment is shared, so the futex is
// not private), woken by the peer's FUTEX_WAKE after its store. The wait
// gives up at the collective's timeout plus kTransportGrace; before that the
// CommWork timeout or the watchdog's guard ends the job naming the rank.
#include "comm/shm_communicator.h"

#include <fcntl.h>
#include <immintrin.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_worker.h"
#include "core/temp_files.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

static_assert(std::endian::native == std::endian::little, "the futex waits on the low half");
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

// Bytes per slot. 1 MiB: at 2 ranks an all-reduce of 32M floats ran at 5.5
// GB/s of bus bandwidth with 1 MiB slots, 5.3 with 512 KiB and 3.1 with 8
// MiB (bench/bench_comm), the larger slots falling out of the caches. The
// segment is two slots per rank.
constexpr std::size_t kSlotBytes = std::size_t{1} << 20;
constexpr std::size_t kLine = 64;
// Pauses a barrier spins before it sleeps in the futex. The first barrier
// of a collective may wait for a peer still computing, which a spin would
// rob of its core (2 ranks on 2 cores): it barely spins. The later ones
// wait for a peer copying the chunk before, a few microseconds, where a
// futex's wake-up costs more: gpt2-124m's ddp step at 2 ranks took 1.50 s
// spinning 20000 (about 0.5 ms) against 1.54-1.76 s spinning 2000. With
// more ranks than cores the peer waited for may be the one a spin keeps
// off the core: none spins (gpt2-tiny's zero3 at 4 ranks on 2 cores took
// 0.63 s a step spinning, against 0.41 s through MPI's own transport).
constexpr int kFirstSpins = 200;
constexpr int kSpins = 20000;

struct Header {
  std::uint64_t nonce;
  std::uint64_t ranks;
};

// What rank 0 broadcasts: the segment's path and nonce (empty path: none).
struct Invitation {
  char path[120];
  std::uint64_t nonce;
};
static_assert(sizeof(Invitation) % 4 == 0);

std::size_t segment_bytes(int ranks) {
  return kLine + static_cast<std::size_t>(ranks) * (kLine + 2 * kSlotBytes);
}

// One mapping of the segment (of fd, or anonymous for fd -1); unmapped
// when destroyed.
class Mapping {
 public:
  Mapping(int fd, std::size_t bytes)
      : bytes_(bytes),
        base_(static_cast<char*>(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                                        MAP_SHARED | (fd < 0 ? MAP_ANONYMOUS : 0), fd, 0))) {
    if (base_ == MAP_FAILED) base_ = nullptr;
  }
  ~Mapping() {
    if (base_) ::munmap(base_, bytes_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  char* base() const { return base_; }

 private:
  std::size_t bytes_;
  char* base_;
};

// An open file descriptor, closed when destroyed.
struct Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// Rank 0's side: a new segment, or null (no /dev/shm, or too little room in
// it: posix_fallocate reserves the pages so that a full tmpfs fails here,
// not with SIGBUS in a collective).
std::unique_ptr<Mapping> create_segment(int ranks, Invitation& inv,
                                        std::unique_ptr<TempFile>& file) {
  std::random_device entropy;
  inv.nonce = (std::uint64_t{entropy()} << 32) | entropy();
  const std::string path =
      "/dev/shm/ztrain-" + std::to_string(::getpid()) + "-" + std::to_string(inv.nonce);
  Fd f(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (f.fd < 0) return nullptr;
  file = std::make_unique<TempFile>(path);
  const std::size_t bytes = segment_bytes(ranks);
  if (::posix_fallocate(f.fd, 0, static_cast<off_t>(bytes)) != 0) return nullptr;
  auto map = std::make_unique<Mapping>(f.fd, bytes);
  if (!map->base()) return nullptr;
  new (map->base()) Header{inv.nonce, static_cast<std::uint64_t>(ranks)};
  std::snprintf(inv.path, sizeof inv.path, "%s", path.c_str());
  return map;
}

// The other ranks' side: rank 0's segment, or null when this rank cannot
// see it (another host) or it is not the one invited to.
std::unique_ptr<Mapping> open_segment(int ranks, const Invitation& inv) {
  Fd f(::open(inv.path, O_RDWR | O_CLOEXEC));
  struct stat st {};
  const std::size_t bytes = segment_bytes(ranks);
  if (f.fd < 0 || ::fstat(f.fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes)
    return nullptr;
  auto map = std::make_unique<Mapping>(f.fd, bytes);
  if (!map->base()) return nullptr;
  Header h{};
  std::memcpy(&h, map->base(), sizeof h);
  if (h.nonce != inv.nonce || h.ranks != static_cast<std::uint64_t>(ranks)) return nullptr;
  return map;
}

// of_split: inner is a group split from a communicator of ours.
std::unique_ptr<Communicator> join(std::unique_ptr<Communicator> inner, int world_rank,
                                   double timeout_s, std::shared_ptr<CommTally> tally,
                                   std::shared_ptr<Watchdog> watchdog, bool of_split, bool spin);

class ShmCommunicator final : public ThreadedCommunicator {
 public:
  // spin: the job has no more ranks than this host has cores.
  ShmCommunicator(std::unique_ptr<Communicator> inner, std::unique_ptr<Mapping> map, int world_rank,
                  double timeout_s, std::shared_ptr<CommTally> tally,
                  std::shared_ptr<Watchdog> watchdog, bool spin)
      : ThreadedCommunicator(world_rank, timeout_s, std::move(tally), std::move(watchdog)),
        inner_(std::move(inner)),
        map_(std::move(map)),
        rank_(inner_->rank()),
        size_(inner_->size()),
        spin_(spin) {
    start_guard();
  }
  ~ShmCommunicator() override { drain(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return inner_->backend(); }
  void set_timeout(double timeout_s) override {
    ThreadedCommunicator::set_timeout(timeout_s);
    inner_->set_timeout(timeout_s);
  }

  CommWork all_reduce_async(void* data, std::size_t count, DType type, ReduceOp op) override {
    return submit_all_reduce(data, count, type, op,
                             [=, this] { all_reduce(static_cast<char*>(data), count, type, op); });
  }
  CommWork reduce_scatter_v_async(const void* send, void* recv,
                                  const std::vector<std::size_t>& counts, DType type,
                                  ReduceOp op) override {
    return submit_reduce_scatter_v(recv, counts, type, op, [=, this] {
      reduce_scatter(static_cast<const char*>(send), static_cast<char*>(recv), counts, type, op);
    });
  }
  CommWork all_gather_v_async(const void* send, void* recv, const std::vector<std::size_t>& counts,
                              DType type) override {
    return submit_all_gather_v(counts, type, [=, this] {
      all_gather(static_cast<const char*>(send), static_cast<char*>(recv), counts, type);
    });
  }
  CommWork broadcast_async(void* data, std::size_t count, DType type, int root) override {
    const std::uint64_t sent = broadcast_sent(count, type, root);
    return submit({Collective::broadcast, "broadcast", count, type}, [=, this] {
      broadcast(static_cast<char*>(data), count * dtype_size(type), root, count, type);
      return sent;
    });
  }
  CommWork barrier_async() override {
    const std::uint64_t sent = ring_bytes_sent(Collective::all_gather, blocks(1), rank_, 4);
    return submit({Collective::barrier, "barrier", 0, DType::f32}, [this, sent] {
      first_meet_ = true;
      meet("barrier", 0, DType::f32);
      return sent;
    });
  }
  CommWork all_to_all_async(const void* send, void* recv, std::size_t count, DType type) override {
    return submit_all_to_all(count, type, [=, this] {
      all_to_all(static_cast<const char*>(send), static_cast<char*>(recv), count, type);
    });
  }
  CommWork permute_async(const void* send, void* recv, std::size_t count, DType type,
                         Peers peers) override {
    return submit_permute(count, type, peers, [=, this] {
      permute(static_cast<const char*>(send), static_cast<char*>(recv), count, type, peers.from);
    });
  }
  std::unique_ptr<Communicator> split(int colour, int key) override {
    std::unique_ptr<Communicator> out;
    submit({std::nullopt, "split", 0, DType::f32}, [&] {
      out = join(inner_->split(colour, key), world_rank_, timeout_s_,
                 std::make_shared<CommTally>(tally_), watchdog_, true, spin_);
      return std::uint64_t{0};
    }).wait();
    return out;
  }

 private:
  std::atomic<std::uint64_t>& arrived(int r) const {
    return *reinterpret_cast<std::atomic<std::uint64_t>*>(map_->base() + kLine +
                                                          static_cast<std::size_t>(r) * kLine);
  }
  // Rank r's slot of the current chunk's set.
  char* slot(int r) const {
    const std::size_t set = chunks_ % 2, ranks = static_cast<std::size_t>(size_);
    return map_->base() + kLine + ranks * kLine +
           (set * ranks + static_cast<std::size_t>(r)) * kSlotBytes;
  }

  // The barrier that ends a chunk's writing phase.
  void meet(const char* op, std::size_t count, DType type) {
    const std::uint64_t mine = ++barriers_;
    std::atomic<std::uint64_t>& own = arrived(rank_);
    own.store(mine, std::memory_order_release);
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&own), FUTEX_WAKE, INT32_MAX, nullptr,
              nullptr, 0);
    const auto deadline = std::chrono::steady_clock::now() + transport_timeout();
    const int spins = !spin_ ? 0 : first_meet_ ? kFirstSpins : kSpins;
    first_meet_ = false;
    for (int r = 0; r < size_; ++r)
      if (r != rank_) wait_for(r, mine, deadline, spins, op, count, type);
  }
  void wait_for(int r, std::uint64_t target, std::chrono::steady_clock::time_point deadline,
                int spins, const char* op, std::size_t count, DType type) const {
    std::atomic<std::uint64_t>& theirs = arrived(r);
    for (int i = 0; i < spins; ++i) {
      if (theirs.load(std::memory_order_acquire) >= target) return;
      _mm_pause();
    }
    for (;;) {
      const std::uint64_t seen = theirs.load(std::memory_order_acquire);
      if (seen >= target) return;
      if (std::chrono::steady_clock::now() > deadline)
        fail(op, count, type,
             " in shared memory: rank " + std::to_string(r) + " did not reach barrier " +
                 std::to_string(target) + " (it is at " + std::to_string(seen) + ")");
      const timespec slice{0, 50'000'000};
      ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&theirs), FUTEX_WAIT,
                static_cast<std::uint32_t>(seen), &slice, nullptr, 0);
    }
  }

  // Runs chunk(at, n) over [0, count) in runs of at most `piece`, each run
  // on the next set of slots. A collective's first barrier is the one that
  // may wait for a peer still computing (meet's spin).
  template <class F>
  void in_chunks(std::size_t count, std::size_t piece, F&& chunk) {
    first_meet_ = true;
    for (std::size_t at = 0; at < count; at += piece, ++chunks_)
      chunk(at, std::min(piece, count - at));
  }

  // Each chunk: every rank copies up to a slot of its buffer in, rank r
  // reduces its 1/size of the chunk in place in rank 0's slot, and all copy
  // the result out.
  void all_reduce(char* data, std::size_t count, DType type, ReduceOp op) {
    const std::size_t es = dtype_size(type);
    in_chunks(count, kSlotBytes / es, [&](std::size_t at, std::size_t n) {
      std::memcpy(slot(rank_), data + at * es, n * es);
      meet("all_reduce", count, type);
      const std::vector<std::size_t> parts = even_split(n, size_);
      const std::size_t from =
          std::accumulate(parts.begin(), parts.begin() + rank_, std::size_t{0}) * es;
      for (int r = 1; r < size_; ++r)
        reduce_into(slot(0) + from, slot(r) + from, parts[static_cast<std::size_t>(rank_)], type,
                    op);
      meet("all_reduce", count, type);
      std::memcpy(data + at * es, slot(0), n * es);
    });
  }
  // Chunk k holds elements [k s, (k+1) s) of every other block (s = a slot
  // over the ranks), so each rank reduces its own block's piece in every
  // chunk, taking its own contribution from send where it is (send and
  // recv never overlap) and the others' from their slots, in rank order:
  // every rank's sum is the same sum.
  void reduce_scatter(const char* send, char* recv, const std::vector<std::size_t>& counts,
                      DType type, ReduceOp op) {
    const std::size_t es = dtype_size(type), piece = kSlotBytes / es / counts.size();
    const std::size_t largest = *std::max_element(counts.begin(), counts.end());
    const auto me = static_cast<std::size_t>(rank_);
    const std::size_t own_from =
        std::accumulate(counts.begin(), counts.begin() + rank_, std::size_t{0});
    in_chunks(largest, piece, [&](std::size_t at, std::size_t) {
      std::size_t from = 0;
      for (std::size_t b = 0; b < counts.size(); from += counts[b], ++b)
        if (b != me && counts[b] > at)
          std::memcpy(slot(rank_) + b * piece * es, send + (from + at) * es,
                      std::min(piece, counts[b] - at) * es);
      meet("reduce_scatter_v", largest, type);
      if (counts[me] <= at) return;
      const std::size_t n = std::min(piece, counts[me] - at);
      for (int r = 0; r < size_; ++r) {
        const char* part = r == rank_ ? send + (own_from + at) * es : slot(r) + me * piece * es;
        if (r == 0)
          std::memcpy(recv + at * es, part, n * es);
        else
          reduce_into(recv + at * es, part, n, type, op);
      }
    });
  }
  void all_gather(const char* send, char* recv, const std::vector<std::size_t>& counts,
                  DType type) {
    const std::size_t es = dtype_size(type), piece = kSlotBytes / es;
    const std::size_t largest = *std::max_element(counts.begin(), counts.end());
    const auto me = static_cast<std::size_t>(rank_);
    in_chunks(largest, piece, [&](std::size_t at, std::size_t) {
      if (counts[me] > at)
        std::memcpy(slot(rank_), send + at * es, std::min(piece, counts[me] - at) * es);
      meet("all_gather_v", largest, type);
      std::size_t from = 0;
      for (std::size_t b = 0; b < counts.size(); from += counts[b], ++b)
        if (counts[b] > at && (b != me || send != recv + from * es))
          std::memcpy(recv + (from + at) * es, slot(static_cast<int>(b)),
                      std::min(piece, counts[b] - at) * es);
    });
  }
  void broadcast(char* data, std::size_t bytes, int root, std::size_t count, DType type) {
    in_chunks(bytes, kSlotBytes, [&](std::size_t at, std::size_t n) {
      if (rank_ == root) std::memcpy(slot(root), data + at, n);
      meet("broadcast", count, type);
      if (rank_ != root) std::memcpy(data + at, slot(root), n);
    });
  }
  // Chunk k holds elements [k s, (k+1) s) of every block (s = a slot over
  // the ranks): rank r writes its block q's piece at place q of its slot,
  // and reads place r of rank q's slot into its block q.
  void all_to_all(const char* send, char* recv, std::size_t count, DType type) {
    const auto ranks = static_cast<std::size_t>(size_), me = static_cast<std::size_t>(rank_);
    const std::size_t es = dtype_size(type), piece = kSlotBytes / es / ranks;
    in_chunks(count, piece, [&](std::size_t at, std::size_t n) {
      for (std::size_t q = 0; q < ranks; ++q)
        std::memcpy(slot(rank_) + q * piece * es, send + (q * count + at) * es, n * es);
      meet("all_to_all", count * ranks, type);
      for (std::size_t q = 0; q < ranks; ++q)
        std::memcpy(recv + (q * count + at) * es, slot(static_cast<int>(q)) + me * piece * es,
                    n * es);
    });
  }
  // Each chunk: every rank writes its piece to its slot and reads the one
  // in the slot of the rank it receives from.
  void permute(const char* send, char* recv, std::size_t count, DType type, int from) {
    const std::size_t es = dtype_size(type);
    in_chunks(count, kSlotBytes / es, [&](std::size_t at, std::size_t n) {
      std::memcpy(slot(rank_), send + at * es, n * es);
      meet("permute", count, type);
      std::memcpy(recv + at * es, slot(from), n * es);
    });
  }

  // Exiting closes inner's connections, which ends the other ranks' waits
  // through their watchdogs.
  void abort_job(int code) override {
    remove_temp_files();
    std::_Exit(code);
  }

  std::unique_ptr<Communicator> inner_;
  std::unique_ptr<Mapping> map_;
  const int rank_, size_;
  const bool spin_;
  std::uint64_t barriers_ = 0;  // barriers this rank has reached (the worker's)
  std::uint64_t chunks_ = 0;    // chunks run, whose parity picks the slots' set
  bool first_meet_ = true;      // no barrier met yet in the running collective
};

// Every rank learns rank 0's invitation, tries it, and all learn whether
// every rank could.
std::unique_ptr<Communicator> join(std::unique_ptr<Communicator> inner, int world_rank,
                                   double timeout_s, std::shared_ptr<CommTally> tally,
                                   std::shared_ptr<Watchdog> watchdog, bool of_split, bool spin) {
  const int ranks = inner->size();
  if (ranks < 2) {
    // A group of one (a split's) needs no file, but stays one of ours, so
    // that its collectives count in the world's tally.
    if (!of_split) return inner;
    auto own = std::make_unique<Mapping>(-1, segment_bytes(1));
    if (!own->base()) throw std::bad_alloc();
    return std::make_unique<ShmCommunicator>(std::move(inner), std::move(own), world_rank,
                                             timeout_s, std::move(tally), std::move(watchdog),
                                             spin);
  }
  Invitation inv{};
  std::unique_ptr<TempFile> file;
  std::unique_ptr<Mapping> map;
  if (inner->rank() == 0) map = create_segment(ranks, inv, file);
  inner->broadcast(&inv, sizeof inv / 4, DType::f32, 0);
  if (inner->rank() != 0 && inv.path[0] != '\0') map = open_segment(ranks, inv);
  float missing = map ? 0.0f : 1.0f;
  inner->all_reduce(&missing, 1, DType::f32, ReduceOp::sum);
  file.reset();  // every rank has mapped it or given up: the name can go
  if (missing != 0.0f) return inner;
  return std::make_unique<ShmCommunicator>(std::move(inner), std::move(map), world_rank, timeout_s,
                                           std::move(tally), std::move(watchdog), spin);
}

}  // namespace

std::unique_ptr<Communicator> share_memory(std::unique_ptr<Communicator> inner, double timeout_s) {
  const auto* threaded = dynamic_cast<const ThreadedCommunicator*>(inner.get());
  std::shared_ptr<Watchdog> watchdog = threaded ? threaded->watchdog() : nullptr;
  const int rank = inner->rank();
  // Every rank of the world is on this host when the segment works.
  const bool spin = inner->size() <= static_cast<int>(std::thread::hardware_concurrency());
  return join(std::move(inner), rank, timeout_s, std::make_shared<CommTally>(), std::move(watchdog),
              false, spin);
}

bool shares_memory(const Communicator& comm) {
  return dynamic_cast<const ShmCommunicator*>(&comm) != nullptr;
}

}  // namespace ztrain
