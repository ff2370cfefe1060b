// The mpi backend: Open MPI collectives on host memory, issued in order by
// one worker thread per communicator so they progress while the caller
// computes. bf16 and f16 sums use MPI user ops that add in fp32. MPI hides
// its wire, so each completed collective is counted as the bytes a ring
// sends for it (comm_tally.h), as the gloo backend does.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <thread>
#include <vector>

#include "comm/beat_frame.h"
#include "comm/comm_worker.h"
#include "comm/start_faults.h"
#include "comm/world.h"
#include "core/temp_files.h"
#include "ztrain/comm.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

template <DType T>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  add_into(inout, in, static_cast<std::size_t>(*len), T);
}
template <DType T>
void max16(void* in, void* inout, int* len, MPI_Datatype*) {
  max_into(inout, in, static_cast<std::size_t>(*len), T);
}

// MPI_Init_thread once per process, MPI_Finalize at exit (after every
// communicator, which holds a reference).
class MpiRuntime {
 public:
  static std::shared_ptr<MpiRuntime> get() {
    static std::shared_ptr<MpiRuntime> runtime(new MpiRuntime);
    return runtime;
  }
  ~MpiRuntime() {
    for (MPI_Op* op : {&bf16_sum, &f16_sum, &bf16_max, &f16_max}) MPI_Op_free(op);
    MPI_Finalize();
  }
  MPI_Op bf16_sum = MPI_OP_NULL, f16_sum = MPI_OP_NULL;
  MPI_Op bf16_max = MPI_OP_NULL, f16_max = MPI_OP_NULL;

 private:
  MpiRuntime() {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw CommError("MPI failed to initialise; start ztrain with mpirun or --nproc");
    if (provided < MPI_THREAD_MULTIPLE)
      throw CommError("this MPI library does not support MPI_THREAD_MULTIPLE (level " +
                      std::to_string(provided) + "); ztrain's communicators need it");
    MPI_Op_create(&sum16<DType::bf16>, 1, &bf16_sum);
    MPI_Op_create(&sum16<DType::f16>, 1, &f16_sum);
    MPI_Op_create(&max16<DType::bf16>, 1, &bf16_max);
    MPI_Op_create(&max16<DType::f16>, 1, &f16_max);
  }
};

MPI_Datatype mpi_type(DType t) {
  return t == DType::f32 ? MPI_FLOAT : MPI_UINT16_T;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Heartbeats as MPI messages on a communicator of their own (a duplicate
// of the world), sent and tested without blocking: rank 0 exchanges them
// with every rank, the others with rank 0. MPI has no wait with a timeout,
// so receive() sleeps, then tests. A call that fails (a peer that died,
// with MPI errors returned rather than fatal) marks the peer as gone. The
// runtime is held so MPI is not finalised under the watchdog's thread.
class MpiBeats final : public Watchdog::Transport {
 public:
  MpiBeats(std::shared_ptr<MpiRuntime> runtime, MPI_Comm world) : runtime_(std::move(runtime)) {
    MPI_Comm_dup(world, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    int size = 1;
    MPI_Comm_size(comm_, &size);
    for (int r = 0; r < size; ++r)
      if (r != rank_ && (rank_ == 0 || r == 0)) peers_.push_back(r);
    send_.resize(peers_.size());
    recv_.resize(peers_.size());
    for (std::size_t i = 0; i < peers_.size(); ++i) post(i);
  }
  ~MpiBeats() override {
    for (auto& s : recv_) {
      if (s.request == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&s.request);
      MPI_Wait(&s.request, MPI_STATUS_IGNORE);
    }
    for (auto& s : send_)
      if (s.request != MPI_REQUEST_NULL) MPI_Request_free(&s.request);
    MPI_Comm_free(&comm_);
  }
  void beat(int peer, const Heartbeat& beat) override {
    const std::size_t i = index(peer);
    Slot& s = send_[i];
    int done = 1;
    if (s.request != MPI_REQUEST_NULL) MPI_Test(&s.request, &done, MPI_STATUS_IGNORE);
    if (!done) return;
    s.frame = encode_beat(beat);
    if (MPI_Isend(&s.frame, kFrameBytes, MPI_BYTE, peer, kTag, comm_, &s.request) != MPI_SUCCESS)
      s.request = MPI_REQUEST_NULL;
  }
  std::vector<Received> receive(std::chrono::milliseconds wait) override {
    std::this_thread::sleep_for(wait);
    std::vector<Received> out;
    for (std::size_t i = 0; i < recv_.size(); ++i) {
      if (recv_[i].request == MPI_REQUEST_NULL) continue;  // gone
      int done = 0;
      if (MPI_Test(&recv_[i].request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        recv_[i].request = MPI_REQUEST_NULL;
        out.push_back({peers_[i], true, {}});
        continue;
      }
      if (!done) continue;
      if (auto beat = decode_beat(recv_[i].frame))
        out.push_back({peers_[i], false, std::move(*beat)});
      post(i);
    }
    return out;
  }

 private:
  static constexpr int kTag = 7;
  static constexpr int kFrameBytes = static_cast<int>(sizeof(BeatFrame));
  struct Slot {
    BeatFrame frame;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::size_t index(int peer) const {
    return static_cast<std::size_t>(std::find(peers_.begin(), peers_.end(), peer) - peers_.begin());
  }
  void post(std::size_t i) {
    if (MPI_Irecv(&recv_[i].frame, kFrameBytes, MPI_BYTE, peers_[i], kTag, comm_,
                  &recv_[i].request) != MPI_SUCCESS)
      recv_[i].request = MPI_REQUEST_NULL;
  }
  std::shared_ptr<MpiRuntime> runtime_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  std::vector<int> peers_;
  std::vector<Slot> send_, recv_;  // per peer; sized once (MPI holds the frames' addresses)
};

class MpiCommunicator final : public ThreadedCommunicator {
 public:
  MpiCommunicator(std::shared_ptr<MpiRuntime> runtime, MPI_Comm comm, double timeout_s,
                  std::shared_ptr<CommTally> tally, std::shared_ptr<Watchdog> watchdog)
      : ThreadedCommunicator(world_rank(), timeout_s, std::move(tally), std::move(watchdog)),
        runtime_(std::move(runtime)),
        comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    start_guard();
  }
  ~MpiCommunicator() override {
    drain();
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }
  // The world: its watchdog's heartbeats go on a communicator of their own.
  static std::unique_ptr<MpiCommunicator> world(std::shared_ptr<MpiRuntime> runtime,
                                                double timeout_s) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    start_fault_point("mpi_init", rank);
    auto watchdog = size > 1 ? std::make_shared<Watchdog>(
                                   rank, size, std::make_unique<MpiBeats>(runtime, MPI_COMM_WORLD))
                             : nullptr;
    auto world =
        std::make_unique<MpiCommunicator>(std::move(runtime), MPI_COMM_WORLD, timeout_s,
                                          std::make_shared<CommTally>(), std::move(watchdog));
    start_fault_point("connected", rank);
    return world;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  CommWork all_reduce_async(void* data, std::size_t count, DType type, ReduceOp op) override {
    const std::uint64_t sent =
        ring_bytes_sent(Collective::all_reduce, even_split(count, size_), rank_, dtype_size(type));
    return submit({Collective::all_reduce, "all_reduce", count, type}, [=, this] {
      check(
          MPI_Allreduce(MPI_IN_PLACE, data, checked(count), mpi_type(type), op_of(type, op), comm_),
          "all_reduce", count, type);
      if (op == ReduceOp::average) divide_in_place(data, count, type, size_);
      return sent;
    });
  }
  CommWork reduce_scatter_async(const void* send, void* recv, std::size_t count, DType type,
                                ReduceOp op) override {
    const std::uint64_t sent =
        ring_bytes_sent(Collective::reduce_scatter, blocks(count), rank_, dtype_size(type));
    return submit({Collective::reduce_scatter, "reduce_scatter", count, type}, [=, this] {
      check(MPI_Reduce_scatter_block(send, recv, checked(count), mpi_type(type), op_of(type, op),
                                     comm_),
            "reduce_scatter", count, type);
      if (op == ReduceOp::average) divide_in_place(recv, count, type, size_);
      return sent;
    });
  }
  CommWork all_gather_async(const void* send, void* recv, std::size_t count, DType type) override {
    // Sending from the own block of recv is the in-place form (MPI forbids
    // aliased buffers otherwise).
    const bool in_place = send == static_cast<const char*>(recv) +
                                      static_cast<std::size_t>(rank_) * count * dtype_size(type);
    const std::uint64_t sent =
        ring_bytes_sent(Collective::all_gather, blocks(count), rank_, dtype_size(type));
    return submit({Collective::all_gather, "all_gather", count, type}, [=, this] {
      check(MPI_Allgather(in_place ? MPI_IN_PLACE : send, checked(count), mpi_type(type), recv,
                          checked(count), mpi_type(type), comm_),
            "all_gather", count, type);
      return sent;
    });
  }
  CommWork reduce_scatter_v_async(const void* send, void* recv,
                                  const std::vector<std::size_t>& counts, DType type,
                                  ReduceOp op) override {
    const auto [ints, displs, total] = layout(counts);
    const std::size_t own = counts[static_cast<std::size_t>(rank_)];
    const std::uint64_t sent =
        ring_bytes_sent(Collective::reduce_scatter, counts, rank_, dtype_size(type));
    return submit(
        {Collective::reduce_scatter, "reduce_scatter_v", total, type},
        [=, this, ints = ints, total = total] {
          check(MPI_Reduce_scatter(send, recv, ints.data(), mpi_type(type), op_of(type, op), comm_),
                "reduce_scatter_v", total, type);
          if (op == ReduceOp::average) divide_in_place(recv, own, type, size_);
          return sent;
        });
  }
  CommWork all_gather_v_async(const void* send, void* recv, const std::vector<std::size_t>& counts,
                              DType type) override {
    const auto [ints, displs, total] = layout(counts);
    const int own = ints[static_cast<std::size_t>(rank_)];
    const bool in_place =
        send ==
        static_cast<const char*>(recv) +
            static_cast<std::size_t>(displs[static_cast<std::size_t>(rank_)]) * dtype_size(type);
    const std::uint64_t sent =
        ring_bytes_sent(Collective::all_gather, counts, rank_, dtype_size(type));
    return submit({Collective::all_gather, "all_gather_v", total, type},
                  [=, this, ints = ints, displs = displs, total = total] {
                    check(MPI_Allgatherv(in_place ? MPI_IN_PLACE : send, own, mpi_type(type), recv,
                                         ints.data(), displs.data(), mpi_type(type), comm_),
                          "all_gather_v", total, type);
                    return sent;
                  });
  }
  CommWork broadcast_async(void* data, std::size_t count, DType type, int root) override {
    const std::uint64_t sent = broadcast_sent(count, type, root);
    return submit({Collective::broadcast, "broadcast", count, type}, [=, this] {
      check(MPI_Bcast(data, checked(count), mpi_type(type), root, comm_), "broadcast", count, type);
      return sent;
    });
  }
  CommWork barrier_async() override {
    // Counted as a ring all-gather of one float (gloo's barrier too).
    const std::uint64_t sent = ring_bytes_sent(Collective::all_gather, blocks(1), rank_, 4);
    return submit({Collective::barrier, "barrier", 0, DType::f32}, [this, sent] {
      check(MPI_Barrier(comm_), "barrier", 0, DType::f32);
      return sent;
    });
  }
  CommWork all_to_all_async(const void* send, void* recv, std::size_t count, DType type) override {
    return submit_all_to_all(count, type, [=, this] {
      check(MPI_Alltoall(send, checked(count), mpi_type(type), recv, checked(count), mpi_type(type),
                         comm_),
            "all_to_all", count * static_cast<std::size_t>(size_), type);
    });
  }
  // Point-to-point messages match apart from the collectives, and a pass
  // follows the one before it between the same pair of ranks (MPI keeps
  // their order), so one tag serves every permute.
  CommWork permute_async(const void* send, void* recv, std::size_t count, DType type,
                         Peers peers) override {
    return submit_permute(count, type, peers, [=, this] {
      check(MPI_Sendrecv(send, checked(count), mpi_type(type), peers.to, kPermuteTag, recv,
                         checked(count), mpi_type(type), peers.from, kPermuteTag, comm_,
                         MPI_STATUS_IGNORE),
            "permute", count, type);
    });
  }
  std::unique_ptr<Communicator> split(int colour, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    submit({std::nullopt, "split", 0, DType::f32}, [&] {
      check(MPI_Comm_split(comm_, colour, key, &sub), "split", 0, DType::f32);
      return std::uint64_t{0};
    }).wait();
    return std::make_unique<MpiCommunicator>(runtime_, sub, timeout_s_,
                                             std::make_shared<CommTally>(tally_), watchdog_);
  }

 private:
  // MPI's op for `op` over type t (the average is a sum, then a division).
  MPI_Op op_of(DType t, ReduceOp op) const {
    if (op == ReduceOp::max)
      return t == DType::f32 ? MPI_MAX : t == DType::bf16 ? runtime_->bf16_max : runtime_->f16_max;
    return t == DType::f32 ? MPI_SUM : t == DType::bf16 ? runtime_->bf16_sum : runtime_->f16_sum;
  }
  struct VLayout {
    std::vector<int> counts, displs;
    std::size_t total;
  };
  // MPI's int counts and displacements of consecutive blocks.
  VLayout layout(const std::vector<std::size_t>& counts) const {
    check_block_counts(counts);
    VLayout v{{}, {}, 0};
    for (std::size_t c : counts) {
      v.displs.push_back(checked(v.total));
      v.counts.push_back(checked(c));
      v.total += c;
    }
    checked(v.total);
    return v;
  }
  static int checked(std::size_t count) {
    if (count > static_cast<std::size_t>(INT32_MAX))
      throw CommError("a collective of " + std::to_string(count) +
                      " elements exceeds MPI's int count; split it into buckets");
    return static_cast<int>(count);
  }
  void check(int rc, const char* op, std::size_t count, DType type) const {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    fail(op, count, type, ": " + std::string(text, static_cast<std::size_t>(len)));
  }
  void abort_job(int code) override {
    remove_temp_files();
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

  static constexpr int kPermuteTag = 11;
  std::shared_ptr<MpiRuntime> runtime_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK"})
    if (const char* text = std::getenv(v)) return std::atoi(text);
  return 0;
}

namespace {

// The first of `names` set in the environment to an integer of at least
// `at_least`; `otherwise` when none is.
int first_env(std::initializer_list<const char*> names, int at_least, int otherwise) {
  for (const char* v : names)
    if (const char* text = std::getenv(v)) {
      const int n = std::atoi(text);
      if (n >= at_least) return n;
    }
  return otherwise;
}

}  // namespace

int local_rank_count() {
  return first_env({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE",
                    "LOCAL_WORLD_SIZE"},
                   1, 1);
}

// The launcher that started this process says where its rank sits: a
// torchrun inside a SLURM allocation inherits SLURM_LOCALID = 0 in every
// worker, so LOCAL_RANK wins for torchrun-style ranks and the MPI names
// for MPI ones.
int local_rank() {
  if (launched_by_mpi())
    return first_env(
        {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMIX_LOCAL_RANK", "SLURM_LOCALID"}, 0,
        0);
  if (launched_by_env()) return first_env({"LOCAL_RANK"}, 0, 0);
  return 0;
}

std::unique_ptr<Communicator> make_mpi_communicator(double timeout_s) {
  auto runtime = MpiRuntime::get();
  return MpiCommunicator::world(std::move(runtime), timeout_s);
}

}  // namespace ztrain
