// The world-1 communicator: every collective is the identity.
#include "ztrain/comm.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  void all_reduce(void*, std::size_t, DType, ReduceOp) override {}
  void broadcast(void*, std::size_t, DType, int root) override {
    if (root != 0)
      throw CommError("broadcast from root " + std::to_string(root) +
                      " in a world of 1 rank (local backend)");
  }
  void barrier() override {}
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

}  // namespace ztrain
