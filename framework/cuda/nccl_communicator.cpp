// The nccl backend (nccl_communicator.h).
#include "cuda/nccl_communicator.h"

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "cuda/cuda_check.h"
#include "kit/collectives.h"
#include "ztrain/error.h"

namespace ztrain::cuda {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
  }
  throw InternalError("nccl: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::average ? ncclAvg : op == ReduceOp::max ? ncclMax : ncclSum;
}

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  if (last && *last) s += std::string(" (") + last + ")";
  return s;
}

// A collective in flight: its event on the communication stream, when it
// was issued, and what messages call it.
struct Pending {
  cudaEvent_t done = nullptr;
  std::chrono::steady_clock::time_point issued;
  std::string text;
  ~Pending() {
    if (done) cudaEventDestroy(done);
  }
};

// What the world communicator and its splits share: the watchdog thread
// and its list of pending collectives across every NCCL communicator of
// the process.
class NcclWatch {
 public:
  NcclWatch(int world_rank, int ordinal) : world_rank_(world_rank), ordinal_(ordinal) {
    thread_ = std::thread([this] { loop(); });
  }
  ~NcclWatch() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void add(std::shared_ptr<Pending> p) {
    std::lock_guard lock(mu_);
    pending_.push_back(std::move(p));
  }
  void watch_comm(ncclComm_t comm) {
    std::lock_guard lock(mu_);
    comms_.push_back(comm);
  }
  void forget_comm(ncclComm_t comm) {
    std::lock_guard lock(mu_);
    std::erase(comms_, comm);
  }
  void set_timeout(double s) { timeout_s_ = s; }

 private:
  void collect_locked() {
    // Events complete in issue order on one stream: stop at the first
    // that has not.
    while (!pending_.empty()) {
      const cudaError_t r = cudaEventQuery(pending_.front()->done);
      if (r == cudaErrorNotReady) {
        cudaGetLastError();
        return;
      }
      if (r != cudaSuccess) die("the GPU reported " + std::string(cudaGetErrorString(r)));
      pending_.pop_front();
    }
  }
  void loop() {
    // The runtime would otherwise make GPU 0 this thread's device (and a
    // context there) for the event queries.
    cudaSetDevice(ordinal_);
    std::unique_lock lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(20));
      collect_locked();
      for (ncclComm_t c : comms_) {
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(c, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress)
          die("NCCL failed: " + nccl_text(async, c));
      }
      if (!pending_.empty()) {
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                            pending_.front()->issued)
                                  .count();
        if (timeout_s_ > 0 && waited > timeout_s_)
          die(pending_.front()->text + " did not finish within " +
              std::to_string(static_cast<int>(timeout_s_)) +
              " s on nccl (a rank stopped calling collectives, or died)");
      }
    }
  }
  [[noreturn]] void die(const std::string& why) {
    std::fprintf(stderr, "ztrain: rank %d: %s; aborting NCCL and the job\n", world_rank_,
                 why.c_str());
    std::fflush(stderr);
    for (ncclComm_t c : comms_) ncclCommAbort(c);
    std::_Exit(3);
  }

  int world_rank_;
  int ordinal_;
  std::atomic<double> timeout_s_{300};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Pending>> pending_;
  std::vector<ncclComm_t> comms_;
  bool stop_ = false;
  std::thread thread_;
};

// A buffer a collective reads or writes, on the GPU: the caller's own when
// it is GPU memory, else a GPU copy (of its contents when it is read),
// copied back by finish() when it is written.
class OnGpu {
 public:
  OnGpu(CudaDevice& device, const void* p, std::size_t bytes, bool read)
      : device_(device),
        host_(CudaDevice::on_gpu(p) ? nullptr : const_cast<void*>(p)),
        bytes_(bytes),
        gpu_(host_ ? nullptr : const_cast<void*>(p)) {
    if (!host_ || bytes == 0) return;
    copy_ = device.allocate(Tier::device, Category::comm, bytes, Fill::undefined);
    gpu_ = copy_.data();
    if (read) device.copy(gpu_, host_, bytes);
  }
  void* get() const { return gpu_; }
  bool staged() const { return host_ != nullptr; }
  void finish() {
    if (host_ && bytes_ > 0) device_.copy(host_, gpu_, bytes_);
  }

 private:
  CudaDevice& device_;
  void* host_;
  std::size_t bytes_;
  void* gpu_;
  Buffer copy_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, CudaDevice& device, std::shared_ptr<NcclWatch> watch,
                   std::shared_ptr<CommTally> tally)
      : comm_(comm), device_(device), watch_(std::move(watch)), tally_(std::move(tally)) {
    ncclCommUserRank(comm_, &rank_);
    ncclCommCount(comm_, &size_);
    watch_->watch_comm(comm_);
  }
  // After a sticky GPU error the stream waits fail too: the communicator is
  // then aborted rather than destroyed, and the error is not thrown out of
  // a destructor.
  ~NcclCommunicator() override {
    watch_->forget_comm(comm_);
    if (cudaStreamSynchronize(device_.comm()) == cudaSuccess) {
      ncclCommDestroy(comm_);
    } else {
      cudaGetLastError();
      ncclCommAbort(comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  void set_timeout(double timeout_s) override { watch_->set_timeout(timeout_s); }

  CommWork all_reduce_async(void* data, std::size_t count, DType type, ReduceOp op) override {
    OnGpu d(device_, data, count * dtype_size(type), true);
    if (d.staged()) return staged({&d}, all_reduce_async(d.get(), count, type, op));
    return issue(
        {Collective::all_reduce, "all_reduce", count, type},
        ring_bytes_sent(Collective::all_reduce, even_split(count, size_), rank_, dtype_size(type)),
        [&](cudaStream_t s) {
          return ncclAllReduce(data, data, count, nccl_type(type), nccl_op(op), comm_, s);
        });
  }

  CommWork reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, DType type,
                                ReduceOp op) override {
    OnGpu in(device_, send, recv_count * size_ * dtype_size(type), true),
        out(device_, recv, recv_count * dtype_size(type), false);
    if (in.staged() || out.staged())
      return staged({&out}, reduce_scatter_async(in.get(), out.get(), recv_count, type, op));
    const std::vector<std::size_t> counts(static_cast<std::size_t>(size_), recv_count);
    return issue({Collective::reduce_scatter, "reduce_scatter", recv_count * size_, type},
                 ring_bytes_sent(Collective::reduce_scatter, counts, rank_, dtype_size(type)),
                 [&](cudaStream_t s) {
                   return ncclReduceScatter(send, recv, recv_count, nccl_type(type), nccl_op(op),
                                            comm_, s);
                 });
  }

  CommWork all_gather_async(const void* send, void* recv, std::size_t send_count,
                            DType type) override {
    OnGpu in(device_, send, send_count * dtype_size(type), true),
        out(device_, recv, send_count * size_ * dtype_size(type), false);
    if (in.staged() || out.staged())
      return staged({&out}, all_gather_async(in.get(), out.get(), send_count, type));
    const std::vector<std::size_t> counts(static_cast<std::size_t>(size_), send_count);
    return issue({Collective::all_gather, "all_gather", send_count * size_, type},
                 ring_bytes_sent(Collective::all_gather, counts, rank_, dtype_size(type)),
                 [&](cudaStream_t s) {
                   return ncclAllGather(send, recv, send_count, nccl_type(type), comm_, s);
                 });
  }

  // One reduce per block, rooted at the block's rank, in one group.
  CommWork reduce_scatter_v_async(const void* send, void* recv,
                                  const std::vector<std::size_t>& counts, DType type,
                                  ReduceOp op) override {
    check_counts(counts);
    const std::size_t own = counts[static_cast<std::size_t>(rank_)];
    OnGpu in(device_, send, total(counts) * dtype_size(type), true),
        out(device_, recv, own * dtype_size(type), false);
    if (in.staged() || out.staged())
      return staged({&out}, reduce_scatter_v_async(in.get(), out.get(), counts, type, op));
    return issue({Collective::reduce_scatter, "reduce_scatter_v", total(counts), type},
                 ring_bytes_sent(Collective::reduce_scatter, counts, rank_, dtype_size(type)),
                 [&](cudaStream_t s) {
                   const auto* base = static_cast<const char*>(send);
                   std::size_t offset = 0;
                   ncclResult_t r = ncclGroupStart();
                   for (int q = 0; q < size_ && r == ncclSuccess; ++q) {
                     const std::size_t n = counts[static_cast<std::size_t>(q)];
                     const void* block = base + offset * dtype_size(type);
                     if (n > 0)
                       r = ncclReduce(block, q == rank_ ? recv : const_cast<void*>(block), n,
                                      nccl_type(type), nccl_op(op), q, comm_, s);
                     offset += n;
                   }
                   const ncclResult_t end = ncclGroupEnd();
                   return r != ncclSuccess ? r : end;
                 });
  }

  // One broadcast per block, rooted at the block's rank, in one group.
  CommWork all_gather_v_async(const void* send, void* recv, const std::vector<std::size_t>& counts,
                              DType type) override {
    check_counts(counts);
    const std::size_t own = counts[static_cast<std::size_t>(rank_)];
    OnGpu in(device_, send, own * dtype_size(type), true),
        out(device_, recv, total(counts) * dtype_size(type), false);
    if (in.staged() || out.staged())
      return staged({&out}, all_gather_v_async(in.get(), out.get(), counts, type));
    return issue({Collective::all_gather, "all_gather_v", total(counts), type},
                 ring_bytes_sent(Collective::all_gather, counts, rank_, dtype_size(type)),
                 [&](cudaStream_t s) {
                   auto* base = static_cast<char*>(recv);
                   std::size_t offset = 0;
                   ncclResult_t r = ncclGroupStart();
                   for (int q = 0; q < size_ && r == ncclSuccess; ++q) {
                     const std::size_t n = counts[static_cast<std::size_t>(q)];
                     void* block = base + offset * dtype_size(type);
                     if (n > 0)
                       r = ncclBroadcast(q == rank_ ? send : block, block, n, nccl_type(type), q,
                                         comm_, s);
                     offset += n;
                   }
                   const ncclResult_t end = ncclGroupEnd();
                   return r != ncclSuccess ? r : end;
                 });
  }

  CommWork broadcast_async(void* data, std::size_t count, DType type, int root) override {
    if (root < 0 || root >= size_)
      throw CommError("broadcast from rank " + std::to_string(root) + " of a communicator of " +
                      std::to_string(size_) + " ranks");
    OnGpu d(device_, data, count * dtype_size(type), true);
    if (d.staged()) return staged({&d}, broadcast_async(d.get(), count, type, root));
    const std::uint64_t sent =
        rank_ == root ? static_cast<std::uint64_t>(count) * dtype_size(type) * (size_ - 1) : 0;
    return issue({Collective::broadcast, "broadcast", count, type}, sent, [&](cudaStream_t s) {
      return ncclBroadcast(data, data, count, nccl_type(type), root, comm_, s);
    });
  }

  // A one-element all-reduce, waited for on the host: the ranks have all
  // reached it when it returns.
  CommWork barrier_async() override {
    if (!barrier_buf_) barrier_buf_ = device_.allocate(Tier::device, Category::comm, sizeof(float));
    CommWork w = issue({Collective::barrier, "barrier", 1, DType::f32}, 0, [&](cudaStream_t s) {
      return ncclAllReduce(barrier_buf_.data(), barrier_buf_.data(), 1, ncclFloat32, ncclSum, comm_,
                           s);
    });
    w.wait();
    ZTRAIN_CUDA(cudaStreamSynchronize(device_.compute()));
    return {};
  }

  // One send and one receive per rank, its own block included, in one
  // group.
  CommWork all_to_all_async(const void* send, void* recv, std::size_t count, DType type) override {
    const std::size_t block = count * dtype_size(type), ranks = static_cast<std::size_t>(size_);
    OnGpu in(device_, send, block * ranks, true), out(device_, recv, block * ranks, false);
    if (in.staged() || out.staged())
      return staged({&out}, all_to_all_async(in.get(), out.get(), count, type));
    return issue(
        {Collective::all_to_all, "all_to_all", count * ranks, type},
        all_to_all_bytes_sent(count, size_, dtype_size(type)), [&](cudaStream_t s) {
          ncclResult_t r = ncclGroupStart();
          for (int q = 0; q < size_ && r == ncclSuccess && count > 0; ++q) {
            const auto at = static_cast<std::size_t>(q) * block;
            r = ncclSend(static_cast<const char*>(send) + at, count, nccl_type(type), q, comm_, s);
            if (r == ncclSuccess)
              r = ncclRecv(static_cast<char*>(recv) + at, count, nccl_type(type), q, comm_, s);
          }
          const ncclResult_t end = ncclGroupEnd();
          return r != ncclSuccess ? r : end;
        });
  }

  CommWork permute_async(const void* send, void* recv, std::size_t count, DType type,
                         Peers peers) override {
    const std::uint64_t sent = permute_bytes_sent(count, dtype_size(type), peers, rank_, size_);
    const std::size_t bytes = count * dtype_size(type);
    OnGpu in(device_, send, bytes, true), out(device_, recv, bytes, false);
    if (in.staged() || out.staged())
      return staged({&out}, permute_async(in.get(), out.get(), count, type, peers));
    return issue({Collective::permute, "permute", count, type}, sent, [&](cudaStream_t s) {
      if (count == 0) return ncclSuccess;
      ncclResult_t r = ncclGroupStart();
      if (r == ncclSuccess) r = ncclSend(send, count, nccl_type(type), peers.to, comm_, s);
      if (r == ncclSuccess) r = ncclRecv(recv, count, nccl_type(type), peers.from, comm_, s);
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  std::unique_ptr<Communicator> split(int colour, int key) override {
    ncclComm_t part = nullptr;
    const ncclResult_t r = ncclCommSplit(comm_, colour, key, &part, nullptr);
    if (r != ncclSuccess)
      throw CommError("rank " + std::to_string(rank_) +
                      ": ncclCommSplit failed: " + nccl_text(r, comm_));
    if (!part) throw CommError("ncclCommSplit gave rank " + std::to_string(rank_) + " no group");
    return std::make_unique<NcclCommunicator>(part, device_, watch_,
                                              std::make_shared<CommTally>(tally_));
  }

  CommCounters counters() const override { return tally_->snapshot(); }

 private:
  template <class F>
  CommWork issue(const CollectiveCall& call, std::uint64_t bytes, F&& enqueue) {
    auto p = std::make_shared<Pending>();
    p->text = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " +
              collective_text(call.op, call.count, call.type);
    ZTRAIN_CUDA(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming));
    const cudaStream_t comm_stream = device_.comm();
    device_.order(comm_stream, device_.compute());
    const ncclResult_t r = enqueue(comm_stream);
    if (r != ncclSuccess) throw CommError(p->text + " failed in NCCL: " + nccl_text(r, comm_));
    ZTRAIN_CUDA(cudaEventRecord(p->done, comm_stream));
    p->issued = std::chrono::steady_clock::now();
    watch_->add(p);
    // Counted when queued: a queued collective completes or the watchdog
    // ends the job, and the step's counts need no wait for the GPU.
    if (call.kind) tally_->record(*call.kind, bytes);
    CudaDevice& dev = device_;
    return CommWork([p, &dev] { ZTRAIN_CUDA(cudaStreamWaitEvent(dev.compute(), p->done, 0)); });
  }

  // Waits for a collective run on GPU copies and copies the written ones
  // back to host memory.
  CommWork staged(std::initializer_list<OnGpu*> written, CommWork work) {
    work.wait();
    for (OnGpu* w : written) w->finish();
    return {};
  }

  void check_counts(const std::vector<std::size_t>& counts) const {
    if (counts.size() != static_cast<std::size_t>(size_))
      throw CommError("an irregular collective got " + std::to_string(counts.size()) +
                      " block counts for " + std::to_string(size_) + " ranks");
  }
  static std::size_t total(const std::vector<std::size_t>& counts) {
    std::size_t t = 0;
    for (std::size_t c : counts) t += c;
    return t;
  }

  ncclComm_t comm_;
  CudaDevice& device_;
  std::shared_ptr<NcclWatch> watch_;
  std::shared_ptr<CommTally> tally_;
  int rank_ = 0, size_ = 1;
  Buffer barrier_buf_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, Device& device,
                                                     double timeout_s) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  if (!cuda)
    throw ConfigError("[comm] backend \"nccl\" needs [device] kind = \"cuda\" ('" + device.name() +
                      "' is not a GPU)");
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      throw CommError("rank 0: ncclGetUniqueId failed: " + nccl_text(r, nullptr));
  }
  // The id is 128 opaque bytes; a broadcast moves them unchanged whatever
  // the element type it is told.
  static_assert(sizeof(id) % 4 == 0);
  bootstrap.broadcast(&id, sizeof(id) / 4, DType::f32, 0);
  ncclComm_t comm = nullptr;
  ZTRAIN_CUDA(cudaSetDevice(cuda->ordinal()));
  const ncclResult_t r = ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank());
  if (r != ncclSuccess)
    throw CommError("rank " + std::to_string(bootstrap.rank()) +
                    " could not join NCCL: " + nccl_text(r, comm));
  auto watch = std::make_shared<NcclWatch>(bootstrap.rank(), cuda->ordinal());
  watch->set_timeout(timeout_s);
  return std::make_unique<NcclCommunicator>(comm, *cuda, std::move(watch),
                                            std::make_shared<CommTally>());
}

}  // namespace ztrain::cuda
