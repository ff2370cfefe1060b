// The world-1 communicator: every collective is the identity or a copy,
// counted as a call that sends nothing.
#include <cstring>

#include "kit/collectives.h"
#include "ztrain/comm.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(std::shared_ptr<CommTally> tally) : tally_(std::move(tally)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  void set_timeout(double) override {}  // nothing waits for another rank
  CommWork all_reduce_async(void*, std::size_t, DType, ReduceOp) override {
    return done(Collective::all_reduce);
  }
  CommWork reduce_scatter_async(const void* send, void* recv, std::size_t count, DType type,
                                ReduceOp) override {
    if (send != recv && count > 0) std::memmove(recv, send, count * dtype_size(type));
    return done(Collective::reduce_scatter);
  }
  CommWork all_gather_async(const void* send, void* recv, std::size_t count, DType type) override {
    if (send != recv && count > 0) std::memmove(recv, send, count * dtype_size(type));
    return done(Collective::all_gather);
  }
  CommWork reduce_scatter_v_async(const void* send, void* recv,
                                  const std::vector<std::size_t>& counts, DType type,
                                  ReduceOp op) override {
    return reduce_scatter_async(send, recv, counts.at(0), type, op);
  }
  CommWork all_gather_v_async(const void* send, void* recv, const std::vector<std::size_t>& counts,
                              DType type) override {
    return all_gather_async(send, recv, counts.at(0), type);
  }
  CommWork broadcast_async(void*, std::size_t, DType, int root) override {
    if (root != 0)
      throw CommError("broadcast from root " + std::to_string(root) +
                      " in a world of 1 rank (local backend)");
    return done(Collective::broadcast);
  }
  CommWork barrier_async() override { return done(Collective::barrier); }
  CommWork all_to_all_async(const void* send, void* recv, std::size_t count, DType type) override {
    if (count > 0) std::memcpy(recv, send, count * dtype_size(type));
    return done(Collective::all_to_all);
  }
  CommWork permute_async(const void* send, void* recv, std::size_t count, DType type,
                         Peers peers) override {
    permute_bytes_sent(count, dtype_size(type), peers, 0, 1);
    if (count > 0) std::memcpy(recv, send, count * dtype_size(type));
    return done(Collective::permute);
  }
  std::unique_ptr<Communicator> split(int, int) override {
    return std::make_unique<LocalCommunicator>(std::make_shared<CommTally>(tally_));
  }
  CommCounters counters() const override { return tally_->snapshot(); }

 private:
  CommWork done(Collective kind) {
    tally_->record(kind, 0);
    return {};
  }
  std::shared_ptr<CommTally> tally_;
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>(std::make_shared<CommTally>());
}

}  // namespace ztrain
