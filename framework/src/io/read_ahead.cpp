#include "io/read_ahead.h"

#include <fcntl.h>

#include <algorithm>

namespace ztrain {

ReadAhead::ReadAhead(int fd, std::uint64_t size, std::uint64_t ahead, std::uint64_t window)
    : fd_(fd), size_(size), ahead_(ahead), window_(window), thread_([this](std::stop_token stop) {
        loop(stop);
      }) {}

void ReadAhead::at(std::uint64_t offset) {
  {
    std::lock_guard lock(mu_);
    if (offset == reader_) return;
    reader_ = offset;
  }
  moved_.notify_all();
}

// The loop keeps one invariant: the bytes in [reader_, next) have been
// asked for. Each turn it restarts at the reader when the reader jumped
// (past `next`, or so far back that `next` is more than `ahead` beyond
// it), asks for the next window when less than `ahead` is asked for past
// the reader, or sleeps until the reader moves (all up to reader + ahead,
// or to the end of the file, is asked for). The lock is dropped around
// readahead(2), which may block on the disk, so at() never waits on it.
void ReadAhead::loop(std::stop_token stop) {
  std::uint64_t next = 0;  // the first byte not yet asked for
  std::unique_lock lock(mu_);
  while (!stop.stop_requested()) {
    // Behind the reader, or more than `ahead` before it: start again at it.
    if (next < reader_ || next > reader_ + ahead_) next = reader_;
    if (next >= size_ || next >= reader_ + ahead_) {
      moved_.wait(lock, stop, [&] {
        return next < reader_ || (next < reader_ + ahead_ && next < size_) ||
               next > reader_ + ahead_;
      });
      continue;
    }
    const std::uint64_t from = next, n = std::min(window_, size_ - next);
    next += n;
    lock.unlock();
    ::readahead(fd_, static_cast<off64_t>(from), n);
    lock.lock();
  }
}

}  // namespace ztrain
