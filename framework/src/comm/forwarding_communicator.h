// ForwardingCommunicator: the base of a communicator that decorates
// another: every call is passed to the one it wraps, each collective's
// submission through around() (a test's failure point, a device opened
// while the copies run), and a split wrapped again by wrap(), so a
// decorator states only what it adds and a new collective is forwarded in
// one place.
//
// Ownership: owns the communicator it wraps. Thread safety: as the wrapped
// one (one caller thread). Part of the host.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ztrain/comm.h"

namespace ztrain {

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(std::unique_ptr<Communicator> inner) : c_(std::move(inner)) {}

  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  std::string backend() const override { return c_->backend(); }
  void set_timeout(double s) override { c_->set_timeout(s); }
  void announce_failure(const std::string& message) override { c_->announce_failure(message); }
  CommWork all_reduce_async(void* d, std::size_t n, DType t, ReduceOp op) override {
    return around(Kind::reduce, [&] { return c_->all_reduce_async(d, n, t, op); });
  }
  CommWork reduce_scatter_async(const void* s, void* r, std::size_t n, DType t,
                                ReduceOp op) override {
    return around(Kind::reduce, [&] { return c_->reduce_scatter_async(s, r, n, t, op); });
  }
  CommWork all_gather_async(const void* s, void* r, std::size_t n, DType t) override {
    return around(Kind::gather, [&] { return c_->all_gather_async(s, r, n, t); });
  }
  CommWork reduce_scatter_v_async(const void* s, void* r, const std::vector<std::size_t>& counts,
                                  DType t, ReduceOp op) override {
    return around(Kind::reduce, [&] { return c_->reduce_scatter_v_async(s, r, counts, t, op); });
  }
  CommWork all_gather_v_async(const void* s, void* r, const std::vector<std::size_t>& counts,
                              DType t) override {
    return around(Kind::gather, [&] { return c_->all_gather_v_async(s, r, counts, t); });
  }
  CommWork broadcast_async(void* d, std::size_t n, DType t, int root) override {
    return around(Kind::broadcast, [&] { return c_->broadcast_async(d, n, t, root); });
  }
  CommWork barrier_async() override {
    return around(Kind::barrier, [&] { return c_->barrier_async(); });
  }
  CommWork all_to_all_async(const void* s, void* r, std::size_t n, DType t) override {
    return around(Kind::exchange, [&] { return c_->all_to_all_async(s, r, n, t); });
  }
  CommWork permute_async(const void* s, void* r, std::size_t n, DType t, Peers p) override {
    return around(Kind::exchange, [&] { return c_->permute_async(s, r, n, t, p); });
  }
  std::unique_ptr<Communicator> split(int colour, int key) override {
    return wrap(c_->split(colour, key));
  }
  CommCounters counters() const override { return c_->counters(); }

 protected:
  // What a collective does: reduces (all_reduce, reduce_scatter), gathers
  // (all_gather), exchanges blocks (all_to_all, permute), or neither.
  enum class Kind { reduce, gather, exchange, broadcast, barrier };
  // Submits one collective (`submit`); by default just that.
  virtual CommWork around(Kind, const std::function<CommWork()>& submit) { return submit(); }
  // The decorator around a communicator split from the wrapped one.
  virtual std::unique_ptr<Communicator> wrap(std::unique_ptr<Communicator> split) = 0;

 private:
  std::unique_ptr<Communicator> c_;
};

}  // namespace ztrain
