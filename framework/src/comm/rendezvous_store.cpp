// The wire: every message is a frame, a 4-byte length then the body. A
// request's body starts with its op byte: hello (magic, link, rank, world),
// set (key length, key, value), get (key), wait (key length and key,
// repeated). The server answers each request with one frame: empty for a
// hello it accepts (else the reason it refuses), set and wait; the value
// for get. A get or wait whose keys are not all there yet is held, and
// answered by the poll loop after the set that completes it; a client has
// one request in flight, so holding one blocks nothing else of its.
#include "comm/rendezvous_store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "ztrain/error.h"

namespace ztrain {
namespace {

constexpr std::uint32_t kMagic = 0x7a74736b;  // "ztsk"
constexpr std::size_t kMaxFrame = std::size_t{1} << 26;
enum Op : char { kHello = 0, kSet = 1, kGet = 2, kWait = 3 };

void put_u32(std::string& s, std::uint32_t v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
std::string frame(const std::string& body) {
  std::string f;
  put_u32(f, static_cast<std::uint32_t>(body.size()));
  return f + body;
}

// Reads a body's fields in order; a short body is a protocol error.
class Reader {
 public:
  explicit Reader(const std::vector<char>& b) : b_(b) {}
  std::uint32_t u32() {
    need(4);
    std::uint32_t v;
    std::memcpy(&v, b_.data() + at_, 4);
    at_ += 4;
    return v;
  }
  std::string bytes(std::size_t n) {
    need(n);
    std::string s(b_.data() + at_, n);
    at_ += n;
    return s;
  }
  std::string rest() { return bytes(b_.size() - at_); }
  bool done() const { return at_ == b_.size(); }

 private:
  void need(std::size_t n) const {
    if (b_.size() - at_ < n) throw CommError("rendezvous store: a malformed request");
  }
  const std::vector<char>& b_;
  std::size_t at_ = 1;  // past the op byte
};

}  // namespace

struct StoreServer::Conn {
  net::Fd fd;
  std::vector<char> in;
  std::string out;
  bool greeted = false, closed = false;
  std::optional<std::vector<char>> held;  // a get or wait not answerable yet
};

StoreServer::StoreServer(net::Fd listener, int world)
    : listener_(std::move(listener)),
      world_(world),
      store_in_(static_cast<std::size_t>(world)),
      beats_in_(static_cast<std::size_t>(world)),
      beats_(static_cast<std::size_t>(world)) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) < 0) throw CommError(net::sys_error("pipe"));
  wake_read_ = net::Fd(pipe_fds[0]);
  wake_write_ = net::Fd(pipe_fds[1]);
  thread_ = std::thread([this] { loop(); });
}

StoreServer::~StoreServer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  const char byte = 0;
  [[maybe_unused]] const ssize_t k = ::write(wake_write_.get(), &byte, 1);
  thread_.join();
}

void StoreServer::loop() {
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
    }
    std::vector<pollfd> fds{{wake_read_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
    for (const auto& c : conns_)
      fds.push_back({c->fd.get(), static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR
    if (fds[1].revents) accept_new();
    for (std::size_t i = 2; i < fds.size(); ++i) {
      Conn& c = *conns_[i - 2];
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) c.closed = !read_from(c) || c.closed;
      if (!c.closed && !c.out.empty()) {
        const ssize_t k = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
        if (k > 0) c.out.erase(0, static_cast<std::size_t>(k));
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) c.closed = true;
      }
    }
    // A set may have completed what another connection waits for.
    for (auto& c : conns_)
      if (!c->closed && c->held && try_answer(*c)) read_from(*c);
    std::erase_if(conns_, [](const auto& c) { return c->closed; });
  }
}

void StoreServer::accept_new() {
  for (;;) {
    const int fd = ::accept(listener_.get(), nullptr, nullptr);
    if (fd < 0) return;
    net::set_options(fd);
    auto c = std::make_unique<Conn>();
    c->fd = net::Fd(fd);
    conns_.push_back(std::move(c));
  }
}

// Reads what arrived and handles every whole request, up to one held;
// false when the peer closed the connection.
bool StoreServer::read_from(Conn& c) {
  bool open = true;
  char buf[4096];
  for (;;) {
    const ssize_t k = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (k > 0) {
      c.in.insert(c.in.end(), buf, buf + k);
      continue;
    }
    if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) open = false;
    break;
  }
  while (!c.held && !c.closed && c.in.size() >= 4) {
    std::uint32_t n;
    std::memcpy(&n, c.in.data(), 4);
    if (n == 0 || n > kMaxFrame) return false;
    if (c.in.size() < 4 + std::size_t{n}) break;
    std::vector<char> body(c.in.begin() + 4, c.in.begin() + 4 + n);
    c.in.erase(c.in.begin(), c.in.begin() + 4 + n);
    try {
      handle(c, body);
    } catch (const CommError&) {
      return false;  // a malformed request: not a ztrain rank
    }
  }
  return open;
}

void StoreServer::handle(Conn& c, const std::vector<char>& body) {
  if (!c.greeted) return hello(c, body);
  Reader r(body);
  if (body[0] == kSet) {
    const std::string key = r.bytes(r.u32());
    data_[key] = r.rest();
    reply(c, "");
  } else if (body[0] == kGet || body[0] == kWait) {
    c.held = body;
    try_answer(c);
  } else {
    throw CommError("rendezvous store: an unknown request");
  }
}

void StoreServer::hello(Conn& c, const std::vector<char>& body) {
  Reader r(body);
  if (body[0] != kHello || body.size() != 17 || r.u32() != kMagic) {
    std::lock_guard lock(mu_);
    if (refused_.empty())
      refused_ = "something that is not a ztrain rank connected to the meeting port";
    arrived_.notify_all();
    c.closed = true;
    return;
  }
  const auto link = static_cast<StoreLink>(r.u32());
  const std::uint32_t rank = r.u32(), world = r.u32();
  std::string refusal;
  std::lock_guard lock(mu_);
  auto& seen = link == StoreLink::beats ? beats_in_ : store_in_;
  if (world != static_cast<std::uint32_t>(world_))
    refusal = "rank " + std::to_string(rank) + " says WORLD_SIZE=" + std::to_string(world) +
              ", rank 0 has WORLD_SIZE=" + std::to_string(world_);
  else if (rank >= world || seen[rank])
    refusal = "two processes claim RANK=" + std::to_string(rank);
  if (!refusal.empty()) {
    if (refused_.empty()) refused_ = refusal;
    arrived_.notify_all();
    reply(c, refusal);
    return;
  }
  seen[rank] = true;
  c.greeted = true;
  if (const std::uint32_t peer = net::peer_addr_of(c.fd.get()); !net::loopback(peer) && !outside_)
    outside_ = net::local_addr_of(c.fd.get());
  reply(c, "");
  if (link == StoreLink::beats) {
    // Handed to the watchdog whole: the accept frame leaves first.
    net::send_all(c.fd.get(), c.out.data(), c.out.size(),
                  net::Clock::now() + std::chrono::seconds(5), "rendezvous store");
    c.out.clear();
    beats_[rank] = std::move(c.fd);
    c.closed = true;
  }
  arrived_.notify_all();
}

// Answers a held get or wait when its keys are all there.
bool StoreServer::try_answer(Conn& c) {
  const std::vector<char>& body = *c.held;
  Reader r(body);
  if (body[0] == kGet) {
    const auto it = data_.find(r.rest());
    if (it == data_.end()) return false;
    reply(c, it->second);
  } else {
    while (!r.done())
      if (!data_.contains(r.bytes(r.u32()))) return false;
    reply(c, "");
  }
  c.held.reset();
  return true;
}

void StoreServer::reply(Conn& c, const std::string& body) {
  c.out += frame(body);
}

bool StoreServer::arrived(int r) const {
  const auto i = static_cast<std::size_t>(r);
  return store_in_[i] && (r == 0 || beats_in_[i]);
}

std::string StoreServer::missing_ranks() const {
  std::string list;
  int count = 0;
  for (int r = 0; r < world_; ++r) {
    if (arrived(r)) continue;
    if (count++ < 16) list += (list.empty() ? "" : ", ") + std::to_string(r);
  }
  return std::string(count == 1 ? "rank " : "ranks ") + list + (count > 16 ? ", ..." : "") + " (" +
         std::to_string(count) + " of " + std::to_string(world_ - 1) + ")";
}

void StoreServer::wait_arrivals(net::Clock::time_point until, const MissingReport& report) {
  const auto start = net::Clock::now();
  auto next_report = start + net::kWaitReportEvery;
  std::unique_lock lock(mu_);
  const auto all_in = [&] {
    for (int r = 0; r < world_; ++r)
      if (!arrived(r)) return false;
    return true;
  };
  for (;;) {
    if (!refused_.empty()) throw CommError("rank 0: " + refused_);
    if (all_in()) return;
    const auto now = net::Clock::now();
    if (now >= until)
      throw CommError("rank 0: never arrived: " + missing_ranks() +
                      "; start them with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE");
    if (now >= next_report) {
      const std::string missing = missing_ranks();
      lock.unlock();
      report(std::chrono::duration<double>(now - start).count(), missing);
      lock.lock();
      next_report += net::kWaitReportEvery;
    }
    arrived_.wait_until(lock, std::min(until, next_report));
  }
}

std::uint32_t StoreServer::outside_address() const {
  std::lock_guard lock(mu_);
  return outside_;
}

std::vector<net::Fd> StoreServer::take_beats() {
  std::lock_guard lock(mu_);
  return std::move(beats_);
}

net::Fd join_store(std::uint32_t addr, std::uint16_t port, int rank, int world, StoreLink link,
                   net::Clock::time_point until, const std::string& who,
                   const net::WaitReport& waiting) {
  net::Fd fd = net::connect_to(addr, port, until, who, waiting);
  std::string hello(1, kHello);
  for (std::uint32_t v : {kMagic, static_cast<std::uint32_t>(link),
                          static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(world)})
    put_u32(hello, v);
  const std::string f = frame(hello);
  net::send_all(fd.get(), f.data(), f.size(), until, who);
  std::uint32_t n = 0;
  net::recv_all(fd.get(), &n, 4, until, who + " (rank 0 gave up?)");
  if (n > 0) {
    std::string refusal(n, '\0');
    net::recv_all(fd.get(), refusal.data(), n, until, who);
    throw CommError(who + ": rank 0 refused this rank: " + refusal);
  }
  return fd;
}

StoreClient::StoreClient(net::Fd fd, std::string who, std::chrono::milliseconds timeout)
    : fd_(std::move(fd)), who_(std::move(who)), timeout_(timeout) {}

void StoreClient::set(const std::string& key, const std::vector<char>& data) {
  std::string body(1, kSet);
  put_u32(body, static_cast<std::uint32_t>(key.size()));
  body += key;
  body.append(data.data(), data.size());
  request(body, std::nullopt, "setting '" + key + "'");
}

std::vector<char> StoreClient::get(const std::string& key) {
  const std::string v = request(std::string(1, kGet) + key, std::nullopt, "reading '" + key + "'");
  return {v.begin(), v.end()};
}

void StoreClient::wait(const std::vector<std::string>& keys) {
  wait_for(keys, std::nullopt);
}

void StoreClient::wait(const std::vector<std::string>& keys,
                       const std::chrono::milliseconds& timeout) {
  wait_for(keys, timeout);
}

void StoreClient::wait_for(const std::vector<std::string>& keys,
                           std::optional<std::chrono::milliseconds> timeout) {
  std::string body(1, kWait), names;
  for (const auto& k : keys) {
    put_u32(body, static_cast<std::uint32_t>(k.size()));
    body += k;
    names += (names.empty() ? "'" : ", '") + k + "'";
  }
  request(body, timeout, "waiting for " + names);
}

void StoreClient::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard lock(mu_);
  timeout_ = timeout;
}

std::uint32_t StoreClient::local_address() const {
  return net::local_addr_of(fd_.get());
}

std::string StoreClient::request(const std::string& body,
                                 std::optional<std::chrono::milliseconds> timeout,
                                 const std::string& what) {
  std::lock_guard lock(mu_);
  const auto until = net::Clock::now() + timeout.value_or(timeout_);
  const std::string context = who_ + ": rendezvous store at rank 0, " + what;
  if (fd_.get() < 0) throw CommError(context + ": an earlier request failed");
  try {
    const std::string f = frame(body);
    net::send_all(fd_.get(), f.data(), f.size(), until, context);
    std::uint32_t n = 0;
    net::recv_all(fd_.get(), &n, 4, until, context);
    std::string answer(n, '\0');
    net::recv_all(fd_.get(), answer.data(), n, until, context);
    return answer;
  } catch (const CommError&) {
    fd_ = net::Fd();  // out of step with the server now
    throw;
  }
}

}  // namespace ztrain
