#include <chrono>
#include <exception>

#include "ztrain/comm.h"
#include "ztrain/error.h"

namespace ztrain {

void CommWork::wait() {
  if (order_) {
    const auto order = std::move(order_);
    order_ = nullptr;
    order();
    return;
  }
  if (!done_.valid()) return;
  if (timeout_s_ > 0 &&
      done_.wait_for(std::chrono::duration<double>(timeout_s_)) == std::future_status::timeout) {
    on_timeout_();
    throw CommError("collective timed out");  // on_timeout_ does not return
  }
  done_.get();
}

void wait_all(std::vector<CommWork>& works) {
  std::exception_ptr first;
  for (auto& w : works) {
    try {
      w.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

bool CommWork::test() const {
  return !done_.valid() || done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

}  // namespace ztrain
