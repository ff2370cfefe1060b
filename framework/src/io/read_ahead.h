// ReadAhead: keeps the kernel reading a file ahead of a reader that walks
// it mostly forwards, so the disk stays busy while the reader copies and
// checksums what has arrived. A thread of its own asks the kernel
// (readahead(2)) for the next `window` bytes whenever fewer than `ahead`
// bytes past the reader's position are requested; a reader that jumps
// (forwards or back) moves the read-ahead with it, so at most `ahead`
// bytes are read that the reader skips. Advice only: a failed readahead()
// changes nothing but speed.
//
// Thread safety: at() from any thread. Part of the host.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace ztrain {

class ReadAhead {
 public:
  // fd must stay open for the object's life; size: the file's.
  ReadAhead(int fd, std::uint64_t size, std::uint64_t ahead, std::uint64_t window);
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // The reader is about to read from `offset` on.
  void at(std::uint64_t offset);

 private:
  void loop(std::stop_token stop);

  const int fd_;
  const std::uint64_t size_, ahead_, window_;
  std::mutex mu_;
  std::condition_variable_any moved_;
  std::uint64_t reader_ = 0;
  std::jthread thread_;
};

}  // namespace ztrain
