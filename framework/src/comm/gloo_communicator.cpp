// The gloo backend: ranks started torchrun-style meet through rank 0's
// rendezvous store (env_rendezvous.h), then gloo's TCP transport connects
// every pair and runs the collectives: its ring all-reduce, ring
// all-gather(v), broadcast and barrier, issued in order by one worker
// thread per communicator so they progress while the caller computes.
// bf16 and f16 are summed in fp32 through a reduce function of ours
// (rounded once per partial sum, as mpi's user op does).
//
// Reduce-scatter: gloo offers it only as the legacy
// ReduceScatterHalvingDoubling (int counts, set up per buffer, a second
// buffer the size of the input), and PyTorch's gloo group all-reduces and
// keeps its block, twice the bytes. Ours is a ring over gloo's unbound
// buffers: gloo moves the bytes, we only order the steps, so each rank
// sends (N-1)/N of the buffer as mpi's reduce-scatter does.
//
// Counting: gloo hides its wire like MPI, so each completed collective is
// counted as the bytes a ring sends for it (comm_tally.h). Timeouts: our
// CommWork timeout fires first and prints the standard message with the
// watchdog's verdict; gloo's own, 10 s later, only frees the worker when
// nobody waits.
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <future>
#include <numeric>
#include <thread>
#include <vector>

#include "comm/comm_worker.h"
#include "comm/env_rendezvous.h"
#include "comm/start_faults.h"
#include "comm/tcp_beats.h"
#include "comm/world.h"
#include "core/temp_files.h"
#include "ztrain/comm.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

using Millis = std::chrono::milliseconds;

// c = a + b for 16-bit floats, each sum in fp32 and rounded once.
template <DType T>
void sum16(void* c, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<std::uint16_t*>(c);
  const auto* x = static_cast<const std::uint16_t*>(a);
  const auto* y = static_cast<const std::uint16_t*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (T == DType::bf16)
      out[i] = float_to_bf16(bf16_to_float(x[i]) + bf16_to_float(y[i]));
    else
      out[i] = float_to_f16(f16_to_float(x[i]) + f16_to_float(y[i]));
  }
}

// c = max(a, b) over n elements of type T.
template <DType T>
void max_of(void* c, const void* a, const void* b, std::size_t n) {
  if (c != a) std::memmove(c, a, n * dtype_size(T));
  max_into(c, b, n, T);
}

gloo::AllreduceOptions::Func reduce_of(DType type, ReduceOp op) {
  if (op == ReduceOp::max)
    return type == DType::f32    ? &max_of<DType::f32>
           : type == DType::bf16 ? &max_of<DType::bf16>
                                 : &max_of<DType::f16>;
  if (type == DType::f32)
    return static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>);
  return type == DType::bf16 ? &sum16<DType::bf16> : &sum16<DType::f16>;
}

std::size_t offset(const std::vector<std::size_t>& counts, int r) {
  return std::accumulate(counts.begin(), counts.begin() + r, std::size_t{0});
}

// What every communicator of a job shares: rank 0's store server, the
// store client, the gloo device.
struct Shared {
  std::shared_ptr<StoreServer> server;
  std::shared_ptr<StoreClient> store;
  std::shared_ptr<gloo::transport::Device> device;
};

class GlooCommunicator final : public ThreadedCommunicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, Shared shared, std::string name,
                   int world_rank, double timeout_s, std::shared_ptr<CommTally> tally,
                   std::shared_ptr<Watchdog> watchdog)
      : ThreadedCommunicator(world_rank, timeout_s, std::move(tally), std::move(watchdog)),
        context_(std::move(context)),
        shared_(std::move(shared)),
        name_(std::move(name)),
        rank_(context_->rank),
        size_(context_->size) {
    start_guard();
  }
  ~GlooCommunicator() override { drain(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "gloo"; }
  void set_timeout(double timeout_s) override {
    ThreadedCommunicator::set_timeout(timeout_s);
    shared_.store->set_timeout(Millis(static_cast<long long>(timeout_s * 1000)));
  }

  CommWork all_reduce_async(void* data, std::size_t count, DType type, ReduceOp op) override {
    return submit_all_reduce(data, count, type, op, [=, this] {
      if (size_ > 1 && count > 0)
        call("all_reduce", count, type, [&] {
          gloo::AllreduceOptions o(context_);
          if (type == DType::f32)
            o.setOutput(static_cast<float*>(data), count);
          else
            o.setOutput(static_cast<std::uint16_t*>(data), count);
          o.setReduceFunction(reduce_of(type, op));
          o.setTimeout(transport_timeout());
          gloo::allreduce(o);
        });
    });
  }
  CommWork reduce_scatter_v_async(const void* send, void* recv,
                                  const std::vector<std::size_t>& counts, DType type,
                                  ReduceOp op) override {
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    return submit_reduce_scatter_v(recv, counts, type, op, [=, this] {
      call("reduce_scatter_v", total, type,
           [&] { ring_reduce_scatter(static_cast<const char*>(send), recv, counts, type, op); });
    });
  }
  CommWork all_gather_v_async(const void* send, void* recv, const std::vector<std::size_t>& counts,
                              DType type) override {
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    return submit_all_gather_v(counts, type, [=, this] {
      const std::size_t es = dtype_size(type);
      char* own = static_cast<char*>(recv) + offset(counts, rank_) * es;
      const std::size_t own_bytes = counts[static_cast<std::size_t>(rank_)] * es;
      // gloo copies the input into the output first; in place there is
      // nothing to copy.
      if (size_ == 1 || total == 0) {
        if (send != own && own_bytes > 0) std::memmove(own, send, own_bytes);
        return;
      }
      call("all_gather_v", total, type, [&] {
        gloo::AllgathervOptions o(context_);
        std::vector<std::size_t> bytes;
        for (std::size_t c : counts) bytes.push_back(c * es);
        if (send != own) o.setInput(const_cast<char*>(static_cast<const char*>(send)), own_bytes);
        o.setOutput(static_cast<char*>(recv), std::move(bytes));
        o.setTimeout(transport_timeout());
        gloo::allgatherv(o);
      });
    });
  }
  CommWork broadcast_async(void* data, std::size_t count, DType type, int root) override {
    const std::uint64_t sent = broadcast_sent(count, type, root);
    return submit({Collective::broadcast, "broadcast", count, type}, [=, this] {
      if (size_ > 1 && count > 0)
        call("broadcast", count, type, [&] {
          gloo::BroadcastOptions o(context_);
          o.setOutput(static_cast<char*>(data), count * dtype_size(type));
          o.setRoot(root);
          o.setTimeout(transport_timeout());
          gloo::broadcast(o);
        });
      return sent;
    });
  }
  CommWork barrier_async() override {
    // Counted as mpi's barrier: a ring all-gather of one float.
    const std::uint64_t sent = ring_bytes_sent(Collective::all_gather, blocks(1), rank_, 4);
    return submit({Collective::barrier, "barrier", 0, DType::f32}, [this, sent] {
      if (size_ > 1)
        call("barrier", 0, DType::f32, [&] {
          gloo::BarrierOptions o(context_);
          o.setTimeout(transport_timeout());
          gloo::barrier(o);
        });
      return sent;
    });
  }
  CommWork all_to_all_async(const void* send, void* recv, std::size_t count, DType type) override {
    return submit_all_to_all(count, type, [=, this] {
      const std::size_t bytes = count * dtype_size(type) * static_cast<std::size_t>(size_);
      if (bytes == 0) return;
      if (size_ == 1) {
        std::memcpy(recv, send, bytes);
        return;
      }
      call("all_to_all", count * static_cast<std::size_t>(size_), type, [&] {
        gloo::AlltoallOptions o(context_);
        o.setInput(const_cast<char*>(static_cast<const char*>(send)), bytes);
        o.setOutput(static_cast<char*>(recv), bytes);
        o.setTimeout(transport_timeout());
        gloo::alltoall(o);
      });
    });
  }
  // A pass through gloo's unbound buffers, in a slot of its own: every
  // rank draws the next slot, a rank passing to itself too, so that the
  // ranks' slots stay in step.
  CommWork permute_async(const void* send, void* recv, std::size_t count, DType type,
                         Peers peers) override {
    return submit_permute(count, type, peers, [=, this] {
      const auto slot = static_cast<std::uint64_t>(context_->nextSlot());
      const std::size_t bytes = count * dtype_size(type);
      if (bytes == 0) return;
      if (peers.to == rank_) {
        std::memcpy(recv, send, bytes);
        return;
      }
      call("permute", count, type, [&] {
        auto out = context_->createUnboundBuffer(const_cast<void*>(send), bytes);
        auto in = context_->createUnboundBuffer(recv, bytes);
        in->recv(peers.from, slot);
        out->send(peers.to, slot);
        in->waitRecv(transport_timeout());
        out->waitSend(transport_timeout());
      });
    });
  }
  std::unique_ptr<Communicator> split(int colour, int key) override {
    std::unique_ptr<Communicator> out;
    submit({std::nullopt, "split", 0, DType::f32}, [&] {
      out = do_split(colour, key);
      return std::uint64_t{0};
    }).wait();
    return out;
  }

 private:
  // Runs f, turning what gloo throws into a CommError naming the operation.
  template <class F>
  void call(const char* op, std::size_t count, DType type, F&& f) const {
    try {
      f();
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      fail(op, count, type, std::string(" in gloo: ") + e.what());
    }
  }

  // Rank r ends with the reduction of every rank's block r. At step s it
  // passes its running reduction of block r-s-1 to the next rank and
  // receives block r-s-2 from the previous one, reducing its own part in.
  void ring_reduce_scatter(const char* in, void* recv, const std::vector<std::size_t>& counts,
                           DType type, ReduceOp op) {
    const std::size_t es = dtype_size(type);
    const std::size_t largest = *std::max_element(counts.begin(), counts.end());
    if (size_ == 1 || largest == 0) {
      if (counts[0] > 0 && size_ == 1) std::memmove(recv, in, counts[0] * es);
      return;
    }
    const auto block = [&](int b) { return static_cast<std::size_t>((b % size_ + size_) % size_); };
    std::array<std::vector<char>, 2> buffers{std::vector<char>(largest * es),
                                             std::vector<char>(largest * es)};
    std::array<std::unique_ptr<gloo::transport::UnboundBuffer>, 2> bound{
        context_->createUnboundBuffer(buffers[0].data(), buffers[0].size()),
        context_->createUnboundBuffer(buffers[1].data(), buffers[1].size())};
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    const auto slot = static_cast<std::uint64_t>(context_->nextSlot());
    std::size_t acc = 0;  // which buffer holds the running sum
    const std::size_t first = block(rank_ - 1);
    std::memcpy(buffers[acc].data(), in + offset(counts, static_cast<int>(first)) * es,
                counts[first] * es);
    for (int s = 0; s < size_ - 1; ++s) {
      const std::size_t sb = block(rank_ - s - 1), rb = block(rank_ - s - 2);
      bound[acc]->send(next, slot, 0, counts[sb] * es);
      bound[1 - acc]->recv(prev, slot, 0, counts[rb] * es);
      bound[1 - acc]->waitRecv(transport_timeout());
      bound[acc]->waitSend(transport_timeout());
      reduce_into(buffers[1 - acc].data(), in + offset(counts, static_cast<int>(rb)) * es,
                  counts[rb], type, op);
      acc = 1 - acc;
    }
    std::memcpy(recv, buffers[acc].data(), counts[static_cast<std::size_t>(rank_)] * es);
  }

  // The members of the new group learn each other's colour and key through
  // a gather over this communicator, then meet in a store namespace of
  // their own and connect a full mesh of their own.
  std::unique_ptr<Communicator> do_split(int colour, int key) {
    std::vector<std::int32_t> all(2 * static_cast<std::size_t>(size_));
    all[2 * static_cast<std::size_t>(rank_)] = colour;
    all[2 * static_cast<std::size_t>(rank_) + 1] = key;
    if (size_ > 1)
      call("split", all.size(), DType::f32, [&] {
        gloo::AllgathervOptions o(context_);
        o.setOutput(all.data(), std::vector<std::size_t>(static_cast<std::size_t>(size_), 2));
        o.setTimeout(transport_timeout());
        gloo::allgatherv(o);
      });
    std::vector<int> members;
    for (int r = 0; r < size_; ++r)
      if (all[2 * static_cast<std::size_t>(r)] == colour) members.push_back(r);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return all[2 * static_cast<std::size_t>(a) + 1] < all[2 * static_cast<std::size_t>(b) + 1];
    });
    const int me =
        static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    const std::string name =
        name_ + "/split" + std::to_string(splits_++) + "/colour" + std::to_string(colour);
    auto sub = std::make_shared<gloo::rendezvous::Context>(me, static_cast<int>(members.size()));
    sub->setTimeout(transport_timeout());
    call("split", members.size(), DType::f32, [&] {
      gloo::rendezvous::PrefixStore store(name, *shared_.store);
      sub->connectFullMesh(store, shared_.device);
    });
    return std::make_unique<GlooCommunicator>(sub, shared_, name, world_rank_, timeout_s_,
                                              std::make_shared<CommTally>(tally_), watchdog_);
  }

  // Exiting closes every connection, which ends the other ranks' waits.
  void abort_job(int code) override {
    remove_temp_files();
    std::_Exit(code);
  }

  std::shared_ptr<gloo::Context> context_;
  Shared shared_;
  const std::string name_;  // this communicator's namespace in the store
  const int rank_, size_;
  int splits_ = 0;
};

}  // namespace

namespace {

// The store gloo connects the world's mesh through, which passes the
// "published" fault point (start_faults.h) once this rank's pair addresses
// are in: gloo sets them under the rank's number (it sets "rank_R", the
// host name, first).
class PublishingStore final : public gloo::rendezvous::Store {
 public:
  PublishingStore(gloo::rendezvous::Store& store, int rank) : store_(store), rank_(rank) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, data);
    if (key == std::to_string(rank_)) start_fault_point("published", rank_);
  }
  std::vector<char> get(const std::string& key) override { return store_.get(key); }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys); }
  void wait(const std::vector<std::string>& keys, const Millis& timeout) override {
    store_.wait(keys, timeout);
  }

 private:
  gloo::rendezvous::Store& store_;
  const int rank_;
};

// gloo's pair waits without end for a peer that cannot reach it (its
// connect ignores the context's timeout), and up to the context's timeout
// for a peer that died after publishing its address. So the world's mesh
// is connected on a thread of its own and waited for here, in slices: a
// rank whose heartbeat link closed (the watchdog runs already) ends the
// wait at once, naming it; otherwise the meeting's timeout does. A thread
// left behind owns what it uses: the job is ending.
void connect_world(const std::shared_ptr<gloo::rendezvous::Context>& context, const Shared& shared,
                   const std::string& address, double timeout_s, const Watchdog* watchdog) {
  const std::string who = "rank " + std::to_string(context->rank);
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> connected = done->get_future();
  std::thread([context, shared, done] {
    try {
      gloo::rendezvous::PrefixStore prefixed("ztrain/world", *shared.store);
      PublishingStore store(prefixed, context->rank);
      std::shared_ptr<gloo::transport::Device> device = shared.device;
      context->connectFullMesh(store, device);
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (connected.wait_for(Millis(50)) == std::future_status::timeout) {
    if (const std::string lost = watchdog ? watchdog->closed_peers() : ""; !lost.empty())
      throw CommError(who + ": " + lost + " (while gloo connected the ranks)");
    if (std::chrono::steady_clock::now() >= until)
      throw CommError(who + ": gloo did not connect this rank with every other within " +
                      std::to_string(static_cast<long long>(timeout_s)) + " s; it listens at " +
                      address +
                      ": a rank that cannot reach that address (a firewall, or another host "
                      "while the address is this host's own) never connects");
  }
  try {
    connected.get();
  } catch (const CommError& e) {
    // From the store, which names a lost rank itself.
    throw CommError(who + ": gloo cannot connect the ranks from " + address + ": " + e.what());
  } catch (const std::exception& e) {
    // A peer that died breaks gloo's pair and closes its heartbeat link at
    // about the same moment; under load gloo's error can come first, so the
    // watchdog gets up to a second to hear which rank it was.
    std::string lost;
    for (int i = 0; i < 20 && watchdog && (lost = watchdog->closed_peers()).empty(); ++i)
      std::this_thread::sleep_for(Millis(50));
    throw CommError(who + ": gloo cannot connect the ranks from " + address + ": " + e.what() +
                    (lost.empty() ? "" : "; " + lost));
  }
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(double timeout_s) {
  // gloo's pairs send with writev, which cannot ask for MSG_NOSIGNAL: a
  // write to a peer that died raises SIGPIPE, whose default action ended
  // this rank silently (exit 141, seen in about one fault-injection trial
  // in twenty) before gloo's error could name the lost rank. Ignored, the
  // write fails with EPIPE and the collective reports it. (Python, where
  // PyTorch runs gloo, ignores SIGPIPE from the start.)
  std::signal(SIGPIPE, SIG_IGN);
  EnvRendezvous met = meet_from_env(timeout_s);
  // The watchdog hears the heartbeat links from the end of the meeting, so
  // a rank lost while gloo connects is known at once (connect_world).
  auto watchdog = met.world > 1 ? std::make_shared<Watchdog>(met.rank, met.world,
                                                             make_tcp_beats(std::move(met.beats)))
                                : nullptr;
  Shared shared{met.server, met.store, nullptr};
  auto context = std::make_shared<gloo::rendezvous::Context>(met.rank, met.world);
  context->setTimeout(Millis(static_cast<long long>(timeout_s * 1000)) + kTransportGrace);
  try {
    gloo::transport::tcp::attr attr(met.address.c_str());
    attr.ai_family = AF_INET;
    shared.device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(met.rank) + ": gloo cannot listen at " + met.address +
                    ": " + e.what());
  }
  connect_world(context, shared, met.address, timeout_s, watchdog.get());
  start_fault_point("connected", met.rank);
  return std::make_unique<GlooCommunicator>(std::move(context), std::move(shared), "ztrain/world",
                                            met.rank, timeout_s, std::make_shared<CommTally>(),
                                            std::move(watchdog));
}

}  // namespace ztrain
