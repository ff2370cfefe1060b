// The guarded cpu device (guarded_device.h): device-tier blocks are
// mmap'ed mappings of their own, PROT_NONE except while an Open lives.
#include "job/guarded_device.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "comm/forwarding_communicator.h"
#include "core/host_threads.h"
#include "kernels/kernel_ops.h"
#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain {
namespace {

class GuardedDevice final : public Device {
 public:
  explicit GuardedDevice(int threads) : threads_(threads) {}

  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string name() const override {
    return "cpu (" + std::to_string(threads_.count()) + " threads), device tier guarded";
  }
  int threads() const override { return threads_.count(); }
  bool host_visible(Tier tier) const override { return tier != Tier::device; }

  // Device-tier blocks are reachable while an Open lives (nested ones
  // count).
  class Open {
   public:
    explicit Open(Device& d) : d_(static_cast<GuardedDevice&>(d)) { d_.set_open(+1); }
    ~Open() { d_.set_open(-1); }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;

   private:
    GuardedDevice& d_;
  };

  void copy(void* dst, const void* src, std::size_t bytes) override {
    const Open open(*this);
    Device::copy(dst, src, bytes);
  }
  void convert(TypedPtr dst, ConstTypedPtr src, std::size_t n) override {
    const Open open(*this);
    Device::convert(dst, src, n);
  }
  void accumulate(TypedPtr dst, ConstTypedPtr src, std::size_t n) override {
    const Open open(*this);
    Device::accumulate(dst, src, n);
  }
  void fill_zero(void* p, std::size_t bytes) override {
    const Open open(*this);
    Device::fill_zero(p, bytes);
  }
  void copy_rows(const RowCopy& c) override {
    const Open open(*this);
    Device::copy_rows(c);
  }

 protected:
  void* raw_allocate(Tier tier, Category, std::size_t bytes, Fill fill) override {
    const std::size_t pages = (bytes + 4095) / 4096 * 4096;
    if (tier != Tier::device) {
      void* p = std::aligned_alloc(4096, pages);
      if (!p) throw OutOfMemoryError("out of memory: the system refused " + format_bytes(bytes));
      if (fill == Fill::zeros) std::memset(p, 0, bytes);
      return p;
    }
    std::lock_guard lock(mu_);
    void* p = ::mmap(nullptr, pages, open_ > 0 ? PROT_READ | PROT_WRITE : PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);  // zero-filled by the kernel
    if (p == MAP_FAILED)
      throw OutOfMemoryError("out of memory: the system refused " + format_bytes(bytes));
    blocks_.emplace(p, pages);
    return p;
  }
  void raw_free(Tier tier, Category, void* p, std::size_t) noexcept override {
    if (tier != Tier::device) return std::free(p);
    std::lock_guard lock(mu_);
    const auto it = blocks_.find(p);
    if (it == blocks_.end()) return;
    ::munmap(p, it->second);
    blocks_.erase(it);
  }

 private:
  void set_open(int delta) {
    std::lock_guard lock(mu_);
    const bool was = open_ > 0;
    open_ += delta;
    if (was == (open_ > 0)) return;
    const int prot = open_ > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
    for (const auto& [p, bytes] : blocks_) ::mprotect(p, bytes, prot);
  }

  HostThreads threads_;  // the cpu kernels' (oneTBB, OpenBLAS)
  std::mutex mu_;
  std::map<void*, std::size_t> blocks_;
  int open_ = 0;
};

using Open = GuardedDevice::Open;

// The cpu kernels with the device opened around every op.
class GuardedKernels final : public Kernels {
 public:
  GuardedKernels(std::unique_ptr<Kernels> inner, Device& device)
      : k_(std::move(inner)), device_(device) {}

#define ZTRAIN_GUARDED(name, args)                       \
  void name ZTRAIN_KERNEL_PARAMS_##name const override { \
    const Open open(device_);                            \
    k_->name args;                                       \
  }
  ZTRAIN_KERNEL_OPS(ZTRAIN_GUARDED)
#undef ZTRAIN_GUARDED

 private:
  std::unique_ptr<Kernels> k_;
  Device& device_;
};

// A world-1 communicator with the device opened around every collective
// (its copies run inside the call).
class GuardedCommunicator final : public ForwardingCommunicator {
 public:
  GuardedCommunicator(std::unique_ptr<Communicator> inner, Device& device)
      : ForwardingCommunicator(std::move(inner)), device_(device) {
    if (size() != 1)
      throw ConfigError(
          "[device] guard = true runs one rank (its checks cannot follow a "
          "collective onto other threads); run it at world 1");
  }

 private:
  CommWork around(Kind, const std::function<CommWork()>& submit) override {
    const Open open(device_);
    return submit();
  }
  std::unique_ptr<Communicator> wrap(std::unique_ptr<Communicator> split) override {
    return std::make_unique<GuardedCommunicator>(std::move(split), device_);
  }

  Device& device_;
};

std::unique_ptr<Communicator> guard(std::unique_ptr<Communicator> inner, Device& device) {
  return std::make_unique<GuardedCommunicator>(std::move(inner), device);
}

}  // namespace

GuardedCpu make_guarded_cpu(int threads) {
  GuardedCpu g;
  g.device = std::make_unique<GuardedDevice>(threads);
  g.kernels = std::make_unique<GuardedKernels>(make_cpu_kernels(), *g.device);
  g.guard_comm = &guard;
  return g;
}

}  // namespace ztrain
