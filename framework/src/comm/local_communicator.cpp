// The world-1 communicator: every collective is the identity or a copy.
#include <cstring>

#include "ztrain/comm.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  CommWork all_reduce_async(void*, std::size_t, DType, ReduceOp) override { return {}; }
  CommWork reduce_scatter_async(const void* send, void* recv, std::size_t count, DType type,
                                ReduceOp) override {
    if (send != recv && count > 0) std::memmove(recv, send, count * dtype_size(type));
    return {};
  }
  CommWork all_gather_async(const void* send, void* recv, std::size_t count, DType type) override {
    if (send != recv && count > 0) std::memmove(recv, send, count * dtype_size(type));
    return {};
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
    return {};
  }
  CommWork barrier_async() override { return {}; }
  std::unique_ptr<Communicator> split(int, int) override {
    return std::make_unique<LocalCommunicator>();
  }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

}  // namespace ztrain
