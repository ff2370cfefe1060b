#include "comm/tcp_beats.h"

#include "comm/beat_frame.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace ztrain {
namespace {

class TcpBeats final : public Watchdog::Transport {
 public:
  explicit TcpBeats(std::vector<net::Fd> control) : links_(control.size()) {
    for (std::size_t r = 0; r < control.size(); ++r) links_[r].fd = std::move(control[r]);
  }

  void beat(int peer, const Heartbeat& beat) override {
    Link& l = links_[static_cast<std::size_t>(peer)];
    if (l.closed || l.fd.get() < 0) return;
    if (!flush(l) || !l.out.empty()) return;  // the previous one has not left yet
    const BeatFrame f = encode_beat(beat);
    const auto* bytes = reinterpret_cast<const char*>(&f);
    l.out.assign(bytes, bytes + sizeof f);
    flush(l);
  }

  std::vector<Received> receive(std::chrono::milliseconds wait) override {
    std::vector<pollfd> fds;
    std::vector<int> ranks;
    for (std::size_t r = 0; r < links_.size(); ++r)
      if (links_[r].fd.get() >= 0 && !links_[r].closed) {
        fds.push_back({links_[r].fd.get(), POLLIN, 0});
        ranks.push_back(static_cast<int>(r));
      }
    std::vector<Received> out;
    if (::poll(fds.data(), fds.size(), static_cast<int>(wait.count())) <= 0) return out;
    for (std::size_t i = 0; i < fds.size(); ++i)
      if (fds[i].revents) read(ranks[i], out);
    return out;
  }

 private:
  struct Link {
    net::Fd fd;
    std::vector<char> in, out;  // partial frames
    bool closed = false;
  };

  // Writes what is pending without blocking; false when the peer is gone.
  bool flush(Link& l) {
    while (!l.out.empty()) {
      const ssize_t k = ::send(l.fd.get(), l.out.data(), l.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        l.out.erase(l.out.begin(), l.out.begin() + k);
      } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        return true;
      } else {
        l.closed = true;
        return false;
      }
    }
    return true;
  }

  void read(int rank, std::vector<Received>& out) {
    Link& l = links_[static_cast<std::size_t>(rank)];
    char buf[4096];
    for (;;) {
      const ssize_t k = ::recv(l.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (k > 0) {
        l.in.insert(l.in.end(), buf, buf + k);
        continue;
      }
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
      l.closed = true;  // 0: closed; otherwise reset
      out.push_back({rank, true, {}});
      return;
    }
    while (l.in.size() >= sizeof(BeatFrame)) {
      BeatFrame f;
      std::memcpy(&f, l.in.data(), sizeof f);
      l.in.erase(l.in.begin(), l.in.begin() + sizeof f);
      if (auto beat = decode_beat(f)) out.push_back({rank, false, std::move(*beat)});
    }
  }

  std::vector<Link> links_;
};

}  // namespace

std::unique_ptr<Watchdog::Transport> make_tcp_beats(std::vector<net::Fd> control) {
  return std::make_unique<TcpBeats>(std::move(control));
}

}  // namespace ztrain
