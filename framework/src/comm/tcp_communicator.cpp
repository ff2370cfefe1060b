// The tcp backend: ranks started independently, torchrun-style (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT), meet at rank 0's address, learn
// every rank's address from it and connect every pair directly. Collectives
// are rings over those connections (reduce-scatter then all-gather for
// all-reduce), issued in order by one worker thread per communicator so
// they progress while the caller computes; every transfer sends to the next
// rank while receiving from the previous one, so rings never deadlock on
// full socket buffers. bf16 and f16 are summed in fp32. IPv4 only.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "comm/comm_worker.h"
#include "comm/socket.h"
#include "comm/tcp_beats.h"
#include "core/temp_files.h"
#include "ztrain/comm.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

using namespace net;
constexpr std::uint32_t kMagic = 0x7a74726e;  // "ztrn"

struct Peer {
  std::uint32_t addr;
  std::uint16_t port;
};

class TcpCommunicator final : public ThreadedCommunicator {
 public:
  // peers: one connected socket per other rank (index = rank; own unused).
  TcpCommunicator(int rank, int size, int world_rank, std::vector<Fd> peers,
                  std::vector<std::uint32_t> addrs, double timeout_s,
                  std::shared_ptr<CommTally> tally, std::shared_ptr<const Watchdog> watchdog)
      : ThreadedCommunicator(world_rank, timeout_s, std::move(tally), std::move(watchdog)),
        rank_(rank),
        size_(size),
        peers_(std::move(peers)),
        addrs_(std::move(addrs)) {}
  ~TcpCommunicator() override { drain(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "tcp"; }

  CommWork all_reduce_async(void* data, std::size_t count, DType type, ReduceOp op) override {
    return submit({Collective::all_reduce, "all_reduce", count, type}, [=, this] {
      const auto counts = even_split(count, size_);
      const std::size_t at = offset(counts, rank_), es = dtype_size(type);
      std::vector<char> mine(counts[static_cast<std::size_t>(rank_)] * es);
      ring_reduce_scatter(data, mine.data(), counts, type, "all_reduce");
      if (op == ReduceOp::average)
        divide_in_place(mine.data(), counts[static_cast<std::size_t>(rank_)], type, size_);
      if (!mine.empty()) std::memcpy(static_cast<char*>(data) + at * es, mine.data(), mine.size());
      ring_all_gather(data, counts, type, "all_reduce");
    });
  }
  CommWork reduce_scatter_async(const void* send, void* recv, std::size_t count, DType type,
                                ReduceOp op) override {
    return reduce_scatter_v_async(
        send, recv, std::vector<std::size_t>(static_cast<std::size_t>(size_), count), type, op);
  }
  CommWork all_gather_async(const void* send, void* recv, std::size_t count, DType type) override {
    return all_gather_v_async(
        send, recv, std::vector<std::size_t>(static_cast<std::size_t>(size_), count), type);
  }
  CommWork reduce_scatter_v_async(const void* send, void* recv,
                                  const std::vector<std::size_t>& counts, DType type,
                                  ReduceOp op) override {
    check_counts(counts);
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    return submit({Collective::reduce_scatter, "reduce_scatter_v", total, type}, [=, this] {
      ring_reduce_scatter(send, recv, counts, type, "reduce_scatter_v");
      if (op == ReduceOp::average)
        divide_in_place(recv, counts[static_cast<std::size_t>(rank_)], type, size_);
    });
  }
  CommWork all_gather_v_async(const void* send, void* recv, const std::vector<std::size_t>& counts,
                              DType type) override {
    check_counts(counts);
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    return submit({Collective::all_gather, "all_gather_v", total, type}, [=, this] {
      const std::size_t es = dtype_size(type);
      char* own = static_cast<char*>(recv) + offset(counts, rank_) * es;
      const std::size_t bytes = counts[static_cast<std::size_t>(rank_)] * es;
      if (send != own && bytes > 0) std::memmove(own, send, bytes);
      ring_all_gather(recv, counts, type, "all_gather_v");
    });
  }
  CommWork broadcast_async(void* data, std::size_t count, DType type, int root) override {
    if (root < 0 || root >= size_)
      throw CommError("broadcast from root " + std::to_string(root) + " in a communicator of " +
                      std::to_string(size_) + " ranks");
    return submit({Collective::broadcast, "broadcast", count, type}, [=, this] {
      const std::size_t bytes = count * dtype_size(type);
      if (rank_ == root) {
        for (int r = 0; r < size_; ++r)
          if (r != root) send_all(fd(r), data, bytes, deadline(), describe("broadcast", r), &sent_);
      } else {
        recv_all(fd(root), data, bytes, deadline(), describe("broadcast", root));
      }
    });
  }
  CommWork barrier_async() override {
    return submit({Collective::barrier, "barrier", 0, DType::f32}, [this] {
      std::vector<float> token(static_cast<std::size_t>(size_));
      ring_all_gather(token.data(), std::vector<std::size_t>(static_cast<std::size_t>(size_), 1),
                      DType::f32, "barrier");
    });
  }
  std::unique_ptr<Communicator> split(int colour, int key) override {
    std::unique_ptr<Communicator> out;
    submit({std::nullopt, "split", 0, DType::f32}, [&] { out = do_split(colour, key); }).wait();
    return out;
  }

 private:
  static std::size_t offset(const std::vector<std::size_t>& counts, int r) {
    return std::accumulate(counts.begin(), counts.begin() + r, std::size_t{0});
  }
  void check_counts(const std::vector<std::size_t>& counts) const {
    if (counts.size() != static_cast<std::size_t>(size_))
      throw CommError("an irregular collective got " + std::to_string(counts.size()) +
                      " block counts for " + std::to_string(size_) + " ranks");
  }
  int fd(int r) const { return peers_[static_cast<std::size_t>(r)].get(); }
  int next() const { return (rank_ + 1) % size_; }
  int prev() const { return (rank_ + size_ - 1) % size_; }
  Clock::time_point deadline() const {
    return Clock::now() + std::chrono::milliseconds(static_cast<long long>(timeout_s_ * 1000));
  }
  std::string describe(const char* op, int peer) const {
    return "rank " + std::to_string(world_rank_) + ": " + op + " with rank " + std::to_string(peer);
  }
  // Ring steps talk to both neighbours.
  std::string describe_ring(const char* op) const {
    if (next() == prev()) return describe(op, next());
    return "rank " + std::to_string(world_rank_) + ": " + op + " (ring: to rank " +
           std::to_string(next()) + ", from rank " + std::to_string(prev()) + ")";
  }

  // Rank r ends with the sum of every rank's block r (in recv). At step s
  // rank r passes its running sum of block r-s-1 on and receives block
  // r-s-2, adding its own part of it.
  void ring_reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts,
                           DType type, const char* op) {
    const std::size_t es = dtype_size(type);
    const auto* in = static_cast<const char*>(send);
    const auto block = [&](int b) { return static_cast<std::size_t>((b % size_ + size_) % size_); };
    if (size_ == 1) {
      if (counts[0] > 0) std::memmove(recv, in, counts[0] * es);
      return;
    }
    const std::size_t largest = *std::max_element(counts.begin(), counts.end());
    std::vector<char> acc(largest * es), incoming(largest * es);
    std::size_t b = block(rank_ - 1);
    if (counts[b] > 0)
      std::memcpy(acc.data(), in + offset(counts, static_cast<int>(b)) * es, counts[b] * es);
    for (int s = 0; s < size_ - 1; ++s) {
      const std::size_t sb = block(rank_ - s - 1), rb = block(rank_ - s - 2);
      exchange(fd(next()), acc.data(), counts[sb] * es, fd(prev()), incoming.data(),
               counts[rb] * es, describe_ring(op), sent_);
      add_into(incoming.data(), in + offset(counts, static_cast<int>(rb)) * es, counts[rb], type);
      std::swap(acc, incoming);
    }
    if (counts[static_cast<std::size_t>(rank_)] > 0)
      std::memcpy(recv, acc.data(), counts[static_cast<std::size_t>(rank_)] * es);
  }

  // Every rank's block r of data ends up everywhere: at step s rank r
  // passes block r-s on and receives block r-s-1.
  void ring_all_gather(void* data, const std::vector<std::size_t>& counts, DType type,
                       const char* op) {
    const std::size_t es = dtype_size(type);
    auto* d = static_cast<char*>(data);
    for (int s = 0; s < size_ - 1; ++s) {
      const int sb = ((rank_ - s) % size_ + size_) % size_;
      const int rb = ((rank_ - s - 1) % size_ + size_) % size_;
      exchange(fd(next()), d + offset(counts, sb) * es, counts[static_cast<std::size_t>(sb)] * es,
               fd(prev()), d + offset(counts, rb) * es, counts[static_cast<std::size_t>(rb)] * es,
               describe_ring(op), sent_);
    }
  }

  std::unique_ptr<Communicator> do_split(int colour, int key) {
    Fd listener = listen_on(0);
    struct Entry {
      std::int32_t colour, key;
      std::uint32_t port;
    };
    std::vector<Entry> all(static_cast<std::size_t>(size_));
    all[static_cast<std::size_t>(rank_)] = {colour, key, port_of(listener.get())};
    ring_all_gather(all.data(), std::vector<std::size_t>(static_cast<std::size_t>(size_), 3),
                    DType::f32, "split");
    std::vector<int> members;
    for (int r = 0; r < size_; ++r)
      if (all[static_cast<std::size_t>(r)].colour == colour) members.push_back(r);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return all[static_cast<std::size_t>(a)].key < all[static_cast<std::size_t>(b)].key;
    });
    const int n = static_cast<int>(members.size());
    const int me =
        static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    std::vector<Fd> peers(static_cast<std::size_t>(n));
    std::vector<std::uint32_t> addrs;
    for (int m : members) addrs.push_back(addrs_[static_cast<std::size_t>(m)]);
    const auto until = deadline();
    for (int j = 0; j < me; ++j) {
      const int r = members[static_cast<std::size_t>(j)];
      peers[static_cast<std::size_t>(j)] =
          connect_to(addrs_[static_cast<std::size_t>(r)],
                     static_cast<std::uint16_t>(all[static_cast<std::size_t>(r)].port), until,
                     describe("split: connect", r));
      const std::uint32_t hello[2] = {kMagic, static_cast<std::uint32_t>(me)};
      send_all(peers[static_cast<std::size_t>(j)].get(), hello, sizeof hello, until, "split");
    }
    for (int k = me + 1; k < n; ++k) {
      Fd c = accept_one(listener.get(), until, "split: accept", nullptr);
      std::uint32_t hello[2];
      recv_all(c.get(), hello, sizeof hello, until, "split");
      if (hello[0] != kMagic || hello[1] <= static_cast<std::uint32_t>(me) ||
          hello[1] >= static_cast<std::uint32_t>(n))
        throw CommError("split: a connection that is not from a member of this group");
      peers[hello[1]] = std::move(c);
    }
    return std::make_unique<TcpCommunicator>(me, n, world_rank_, std::move(peers), std::move(addrs),
                                             timeout_s_, std::make_shared<CommTally>(tally_),
                                             watchdog_);
  }

  // f's sends add to sent_ (the worker runs one collective at a time).
  CommWork submit(const CollectiveCall& call, std::function<void()> f) {
    return ThreadedCommunicator::submit(call, [this, f = std::move(f)] {
      sent_ = 0;
      f();
      return sent_;
    });
  }
  // Exiting closes every socket, which ends the other ranks' waits.
  void abort_job() override {
    remove_temp_files();
    std::_Exit(3);
  }

  int rank_, size_;
  std::vector<Fd> peers_;
  std::vector<std::uint32_t> addrs_;
  std::uint64_t sent_ = 0;
};

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) throw CommError(std::string(name) + " is not set");
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end || x < 0 || x > 1 << 20)
    throw CommError(std::string(name) + "=" + v + " is not a non-negative integer");
  return static_cast<int>(x);
}

}  // namespace

namespace {

// Where the ranks meet, as the environment says.
struct Meeting {
  int rank, world;
  std::string master;  // MASTER_ADDR
  std::uint32_t master_addr;
  std::uint16_t port;
  std::string port_name;  // what messages call the port
  Clock::time_point until;
  std::string who;  // "rank R"
};

Meeting meeting_from_env(double timeout_s) {
  Meeting m;
  m.world = env_int("WORLD_SIZE");
  m.rank = env_int("RANK");
  if (m.world < 1 || m.rank >= m.world)
    throw CommError("RANK=" + std::to_string(m.rank) +
                    " is outside WORLD_SIZE=" + std::to_string(m.world));
  const char* master = std::getenv("MASTER_ADDR");
  const char* port_text = std::getenv("MASTER_PORT");
  if (!master || !port_text)
    throw CommError(
        "a RANK/WORLD_SIZE launch needs MASTER_ADDR and MASTER_PORT (rank 0's "
        "address and a free port on it), as torchrun sets them");
  // torchrun's agent keeps its own store on MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE): the ranks meet on the port after it.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool beside_agent = agent_store && std::string(agent_store) == "True";
  const int port = env_int("MASTER_PORT") + (beside_agent ? 1 : 0);
  m.port_name =
      std::to_string(port) + (beside_agent ? " (MASTER_PORT + 1, beside torchrun's store)" : "");
  if (port < 1 || port > 65535)
    throw CommError("MASTER_PORT=" + std::string(port_text) + ": port " + m.port_name +
                    " is not usable; choose another MASTER_PORT");
  m.port = static_cast<std::uint16_t>(port);
  m.master = master;
  m.master_addr = resolve(master);
  m.until = Clock::now() + std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  m.who = "rank " + std::to_string(m.rank);
  return m;
}

// Rank 0: every other rank connects to the meeting port and says who it is
// and where it listens; that connection stays open as the rank's control
// connection (heartbeats). Returns every rank's address and port, handed
// out to all.
std::vector<Peer> gather_table(const Meeting& m, int listener, std::vector<Fd>& control) {
  std::vector<Peer> table(static_cast<std::size_t>(m.world));
  table[0] = {m.master_addr, m.port};
  // Who has not come yet: said every few seconds, and when giving up.
  const auto absent = [&] {
    std::string list;
    int count = 0;
    for (int r = 1; r < m.world; ++r)
      if (control[static_cast<std::size_t>(r)].get() < 0 && count++ < 16)
        list += (list.empty() ? "" : ", ") + std::to_string(r);
    return std::string(count == 1 ? "rank " : "ranks ") + list + (count > 16 ? ", ..." : "") +
           " (" + std::to_string(count) + " of " + std::to_string(m.world - 1) + ")";
  };
  const WaitReport missing = [&](double waited) {
    std::fprintf(stderr,
                 "%s: waiting at port %s for %s, not arrived after %.0f s; giving up after "
                 "[comm] timeout\n",
                 m.who.c_str(), m.port_name.c_str(), absent().c_str(), waited);
    std::fflush(stderr);
  };
  for (int k = 1; k < m.world; ++k) {
    std::uint32_t addr = 0;
    Fd c;
    try {
      c = accept_one(listener, m.until, m.who + ": waiting at port " + m.port_name, &addr, missing);
    } catch (const CommError& e) {
      throw CommError(std::string(e.what()) + "; never arrived: " + absent() +
                      "; start them with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE");
    }
    std::uint32_t hello[4];
    recv_all(c.get(), hello, sizeof hello, m.until, m.who + ": rendezvous");
    if (hello[0] != kMagic)
      throw CommError(m.who + ": something that is not a ztrain rank connected to port " +
                      m.port_name);
    if (hello[2] != static_cast<std::uint32_t>(m.world))
      throw CommError(m.who + ": rank " + std::to_string(hello[1]) + " says WORLD_SIZE=" +
                      std::to_string(hello[2]) + ", this rank " + std::to_string(m.world));
    const std::uint32_t r = hello[1];
    if (r == 0 || r >= static_cast<std::uint32_t>(m.world) || control[r].get() >= 0)
      throw CommError(m.who + ": two processes claim RANK=" + std::to_string(r) +
                      " (or it is out of range)");
    table[r] = {addr, static_cast<std::uint16_t>(hello[3])};
    control[r] = std::move(c);
  }
  // Ranks on rank 0's machine may have come over loopback (or MASTER_ADDR
  // may name this host as 127.0.1.1): other machines need the address they
  // reached rank 0 at.
  std::uint32_t outside = 0;
  for (int r = 1; r < m.world && !outside; ++r)
    if (!loopback(table[static_cast<std::size_t>(r)].addr))
      outside = local_addr_of(control[static_cast<std::size_t>(r)].get());
  if (outside)
    for (auto& entry : table)
      if (loopback(entry.addr)) entry.addr = outside;
  for (int r = 1; r < m.world; ++r)
    send_all(control[static_cast<std::size_t>(r)].get(), table.data(), table.size() * sizeof(Peer),
             m.until, m.who + ": rendezvous");
  return table;
}

// Ranks > 0: the control connection to rank 0, and the table from it.
std::vector<Peer> fetch_table(const Meeting& m, std::uint16_t own_port, Fd& control) {
  const WaitReport waiting = [&](double waited) {
    std::fprintf(stderr,
                 "%s: rank 0 is not listening at %s, port %s, after %.0f s; still trying until "
                 "[comm] timeout\n",
                 m.who.c_str(), m.master.c_str(), m.port_name.c_str(), waited);
    std::fflush(stderr);
  };
  control =
      connect_to(m.master_addr, m.port, m.until,
                 m.who + ": cannot reach rank 0 at " + m.master + ", port " + m.port_name, waiting);
  const std::uint32_t hello[4] = {kMagic, static_cast<std::uint32_t>(m.rank),
                                  static_cast<std::uint32_t>(m.world), own_port};
  send_all(control.get(), hello, sizeof hello, m.until, m.who + ": rendezvous");
  std::vector<Peer> table(static_cast<std::size_t>(m.world));
  recv_all(control.get(), table.data(), table.size() * sizeof(Peer), m.until,
           m.who + ": rendezvous (rank 0 gave up?)");
  return table;
}

// The data connections: every rank connects to each lower rank's listener
// and accepts the higher ranks on its own.
std::vector<Fd> connect_mesh(const Meeting& m, int listener, const std::vector<Peer>& table) {
  std::vector<Fd> peers(static_cast<std::size_t>(m.world));
  for (int j = 0; j < m.rank; ++j) {
    const Peer& p = table[static_cast<std::size_t>(j)];
    peers[static_cast<std::size_t>(j)] =
        connect_to(p.addr, p.port, m.until, m.who + ": cannot reach rank " + std::to_string(j));
    const std::uint32_t id[2] = {kMagic, static_cast<std::uint32_t>(m.rank)};
    send_all(peers[static_cast<std::size_t>(j)].get(), id, sizeof id, m.until, m.who + ": connect");
  }
  for (int k = m.rank + 1; k < m.world; ++k) {
    Fd c = accept_one(listener, m.until, m.who + ": waiting for higher ranks", nullptr);
    std::uint32_t id[2];
    recv_all(c.get(), id, sizeof id, m.until, m.who + ": connect");
    if (id[0] != kMagic || id[1] <= static_cast<std::uint32_t>(m.rank) ||
        id[1] >= static_cast<std::uint32_t>(m.world) || peers[id[1]].get() >= 0)
      throw CommError(m.who + ": an unexpected connection while meeting the other ranks");
    peers[id[1]] = std::move(c);
  }
  return peers;
}

}  // namespace

std::unique_ptr<Communicator> make_tcp_communicator(double timeout_s) {
  const Meeting m = meeting_from_env(timeout_s);
  Fd listener = listen_on(m.rank == 0 ? m.port : 0);
  std::vector<Fd> control(static_cast<std::size_t>(m.world));
  const std::vector<Peer> table = m.rank == 0 ? gather_table(m, listener.get(), control)
                                              : fetch_table(m, port_of(listener.get()), control[0]);
  std::vector<Fd> peers = connect_mesh(m, listener.get(), table);
  std::vector<std::uint32_t> addrs;
  for (const Peer& p : table) addrs.push_back(p.addr);
  auto watchdog = m.world > 1 ? std::make_shared<const Watchdog>(m.rank, m.world,
                                                                 make_tcp_beats(std::move(control)))
                              : nullptr;
  return std::make_unique<TcpCommunicator>(m.rank, m.world, m.rank, std::move(peers),
                                           std::move(addrs), timeout_s,
                                           std::make_shared<CommTally>(), std::move(watchdog));
}

}  // namespace ztrain
