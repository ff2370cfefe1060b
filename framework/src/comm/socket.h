// TCP socket primitives of the rendezvous store and the heartbeat links of
// torchrun-style launches (gloo carries the collectives): an owning
// descriptor, listening, connecting with retries up to a deadline, and
// whole sends and receives on non-blocking sockets that give up at the
// deadline. IPv4 only. Part of the host.
//
// Errors: CommError naming `what` and the system's reason; a reset or
// closed connection is a PeerClosed, saying that the peer has gone.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "ztrain/error.h"

namespace ztrain::net {

using Clock = std::chrono::steady_clock;

// The peer closed or reset the connection: it exited or died.
class PeerClosed final : public CommError {
 public:
  using CommError::CommError;
};

// A socket, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

std::string sys_error(const std::string& what);
// TCP_NODELAY and non-blocking.
void set_options(int fd);
// Waits for fd to be ready for `events` (poll's), up to the deadline.
void wait_for(int fd, short events, Clock::time_point deadline, const std::string& what);
void send_all(int fd, const void* data, std::size_t n, Clock::time_point deadline,
              const std::string& what);
void recv_all(int fd, void* data, std::size_t n, Clock::time_point deadline,
              const std::string& what);
// A listening socket on addr:port (addr in network order, INADDR_ANY for
// every interface; port 0: any free port). `hint` ends the message of a
// failed bind (what to do about it).
Fd listen_on(std::uint32_t addr, std::uint16_t port, const std::string& hint);
// Called every kWaitReportEvery while a rendezvous waits, with the seconds
// waited so far, so a rank waiting for peers that never come says so.
using WaitReport = std::function<void(double waited_s)>;
inline constexpr std::chrono::seconds kWaitReportEvery{5};
// Connects to addr:port, retrying until the deadline (the peer may not be
// listening yet).
Fd connect_to(std::uint32_t addr, std::uint16_t port, Clock::time_point deadline,
              const std::string& what, const WaitReport& report = {});
bool loopback(std::uint32_t addr);
// The local and the remote address of a connected socket (network order).
std::uint32_t local_addr_of(int fd);
std::uint32_t peer_addr_of(int fd);
// host's IPv4 address (network order).
std::uint32_t resolve(const std::string& host);
// addr (network order) as dotted text: "10.0.0.5".
std::string dotted(std::uint32_t addr);

}  // namespace ztrain::net
