#include "comm/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "ztrain/error.h"

namespace ztrain::net {

std::string sys_error(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

namespace {
// A failed send or receive: a reset or broken connection means the peer is
// gone, which is what the user needs to hear.
[[noreturn]] void io_error(const std::string& what) {
  if (errno == ECONNRESET || errno == EPIPE)
    throw PeerClosed(what + ": the peer closed the connection (it exited or died)");
  throw CommError(sys_error(what));
}

}  // namespace

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

void set_options(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void wait_for(int fd, short events, Clock::time_point deadline, const std::string& what) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) throw CommError(what + " timed out");
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (rc > 0) return;
    if (rc < 0 && errno != EINTR) throw CommError(sys_error(what));
  }
}

void send_all(int fd, const void* data, std::size_t n, Clock::time_point deadline,
              const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      wait_for(fd, POLLOUT, deadline, what);
    } else {
      io_error(what);
    }
  }
}

void recv_all(int fd, void* data, std::size_t n, Clock::time_point deadline,
              const std::string& what) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
    } else if (k == 0) {
      throw PeerClosed(what + ": the peer closed the connection (it exited or died)");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      wait_for(fd, POLLIN, deadline, what);
    } else {
      io_error(what);
    }
  }
}

Fd listen_on(std::uint32_t addr, std::uint16_t port, const std::string& hint) {
  Fd fd(::socket(AF_INET, SOCK_STREAM, 0));
  if (fd.get() < 0) throw CommError(sys_error("socket"));
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = addr;
  a.sin_port = htons(port);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) < 0)
    throw CommError(
        sys_error("cannot listen at " + dotted(addr) + ", port " + std::to_string(port)) + "; " +
        hint);
  if (::listen(fd.get(), 128) < 0) throw CommError(sys_error("listen"));
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  return fd;
}

namespace {
bool connected_to_self(int fd) {
  sockaddr_in here{}, there{};
  socklen_t a = sizeof here, b = sizeof there;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&here), &a);
  ::getpeername(fd, reinterpret_cast<sockaddr*>(&there), &b);
  return here.sin_addr.s_addr == there.sin_addr.s_addr && here.sin_port == there.sin_port;
}

}  // namespace

// Non-blocking, so a host that drops packets cannot hold a connect past the
// deadline.
Fd connect_to(std::uint32_t addr, std::uint16_t port, Clock::time_point deadline,
              const std::string& what, const WaitReport& report) {
  const auto start = Clock::now();
  auto next_report = start + kWaitReportEvery;
  for (;;) {
    Fd fd(::socket(AF_INET, SOCK_STREAM, 0));
    if (fd.get() < 0) throw CommError(sys_error("socket"));
    set_options(fd.get());
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = addr;
    a.sin_port = htons(port);
    int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
    if (rc < 0 && errno == EINPROGRESS) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd p{fd.get(), POLLOUT, 0};
      if (left.count() > 0 &&
          ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 5000))) > 0) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    // Retrying a connect to a free local port can, by TCP simultaneous
    // open, connect the socket to itself: that is no peer.
    if (rc == 0 && !connected_to_self(fd.get())) return fd;
    if (Clock::now() > deadline) throw CommError(sys_error(what));
    if (report && Clock::now() >= next_report) {
      report(std::chrono::duration<double>(Clock::now() - start).count());
      next_report += kWaitReportEvery;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool loopback(std::uint32_t addr) {
  return (ntohl(addr) >> 24) == 127;
}

std::uint32_t local_addr_of(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return a.sin_addr.s_addr;
}

std::uint32_t peer_addr_of(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return a.sin_addr.s_addr;
}

std::string dotted(std::uint32_t addr) {
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &addr, text, sizeof text);
  return text;
}

std::uint32_t resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res)
    throw CommError("MASTER_ADDR=" + host + " does not resolve to an IPv4 address");
  const std::uint32_t addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr.s_addr;
  ::freeaddrinfo(res);
  return addr;
}

}  // namespace ztrain::net
