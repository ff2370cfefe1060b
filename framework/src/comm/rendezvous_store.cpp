// The wire: every message is a frame, a 4-byte length then the body. A
// request's body starts with its op byte: hello (magic, link, rank, world),
// set (key length, key, value), get (key), wait (key length and key,
// repeated). The server answers each request with one frame whose first
// byte says whether it succeeded: then nothing follows for a hello, set and
// wait, the value for get; else the reason (a refused hello, a rank lost
// during the meeting). A get or wait whose keys are not all there yet is
// held, and answered by the poll loop after the set that completes it; a
// client has one request in flight, so holding one blocks nothing else of
// its.
//
// Losing a rank: a rank's store link stays open for the life of the job,
// so the server sees it close when the rank exits or dies. From then on
// every held request and every new one, hello included, is answered with
// the failure naming that rank and what it had done last (its stage:
// joined, met, published its gloo address), and wait_arrivals() raises it:
// a rank lost while the ranks start ends the others at once instead of
// leaving them to wait for the meeting's timeout.
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

// "zts2": the second version of this wire (answers carry a status byte).
constexpr std::uint32_t kMagic = 0x7a747332;
constexpr std::size_t kMaxFrame = std::size_t{1} << 26;
enum Op : char { kHello = 0, kSet = 1, kGet = 2, kWait = 3 };
enum Status : char { kDone = 0, kFailed = 1 };
// Connections dropped (not ztrain ranks of this job) that rank 0 names on
// its output; a scanner's next thousand are dropped silently.
constexpr int kDroppedShown = 5;

// Whether a hello's token is the job's, in a time that does not say how
// much of it matched.
bool same_token(const std::string& given, const std::string& job) {
  if (given.size() != job.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < job.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ job[i]);
  return diff == 0;
}

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
  bool last = false;                      // closed once `out` has left (a refusal's answer)
  int rank = -1;                          // once greeted as a rank's store link
  std::optional<std::vector<char>> held;  // a get or wait not answerable yet
};

StoreServer::StoreServer(std::vector<net::Fd> listeners, int world, std::string token)
    : listeners_(std::move(listeners)),
      world_(world),
      token_(std::move(token)),
      store_in_(static_cast<std::size_t>(world)),
      beats_in_(static_cast<std::size_t>(world)),
      published_(static_cast<std::size_t>(world)),
      told_(static_cast<std::size_t>(world)),
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
  last_words();
}

// Rank 0 is ending. A rank lost just before (rank 0 may end because of it)
// is noticed now if the loop had no time to; then every open store link
// gets what the loop had still to send and, when the job failed, why, as
// a frame its rank reads as the answer to its next request (it arrives
// before the connection closes), so ranks that learn of the failure only
// from rank 0's end still name the rank that was lost. At most a second.
void StoreServer::last_words() {
  for (const auto& c : conns_) {
    char byte;
    if (!c->closed && c->rank >= 0 && ::recv(c->fd.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
      c->closed = true;
    if (c->closed && c->rank >= 0) lose(c->rank);
  }
  const std::string why = failed();
  const auto until = net::Clock::now() + std::chrono::seconds(1);
  for (const auto& c : conns_) {
    if (c->closed) continue;
    if (!why.empty() && c->rank >= 0 && c->out.empty() && !c->last) refuse(*c, why);
    if (c->out.empty()) continue;
    try {
      net::send_all(c->fd.get(), c->out.data(), c->out.size(), until, "rendezvous store");
    } catch (const CommError&) {
      // That rank is gone too.
    }
  }
}

void StoreServer::loop() {
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
    }
    std::vector<pollfd> fds{{wake_read_.get(), POLLIN, 0}};
    for (const auto& l : listeners_) fds.push_back({l.get(), POLLIN, 0});
    const std::size_t first_conn = fds.size();
    for (const auto& c : conns_)
      fds.push_back({c->fd.get(), static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR
    for (std::size_t i = 1; i < first_conn; ++i)
      if (fds[i].revents) accept_new(fds[i].fd);
    for (std::size_t i = first_conn; i < fds.size(); ++i) {
      Conn& c = *conns_[i - first_conn];
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) c.closed = !read_from(c) || c.closed;
      if (!c.closed && !c.out.empty()) {
        const ssize_t k = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
        if (k > 0) c.out.erase(0, static_cast<std::size_t>(k));
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) c.closed = true;
      }
      if (c.last && c.out.empty()) c.closed = true;
    }
    for (const auto& c : conns_)
      if (c->closed && c->rank >= 0) lose(c->rank);
    // A set may have completed what another connection waits for.
    for (auto& c : conns_)
      if (!c->closed && c->held && try_answer(*c)) read_from(*c);
    std::erase_if(conns_, [](const auto& c) { return c->closed; });
  }
}

void StoreServer::accept_new(int listener) {
  for (;;) {
    const int fd = ::accept(listener, nullptr, nullptr);
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
  while (!c.held && !c.closed && !c.last && c.in.size() >= 4) {
    std::uint32_t n;
    std::memcpy(&n, c.in.data(), 4);
    if (n == 0 || n > kMaxFrame) {
      if (!c.greeted) drop(c, "that is not a ztrain rank (or one of another ztrain version)", "");
      return false;
    }
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
  if (const std::string why = failed(); !why.empty()) return refuse(c, why);
  Reader r(body);
  if (body[0] == kSet) {
    const std::string key = r.bytes(r.u32());
    data_[key] = r.rest();
    {
      std::lock_guard lock(mu_);
      published_[static_cast<std::size_t>(c.rank)] = true;
    }
    reply(c, "");
  } else if (body[0] == kGet || body[0] == kWait) {
    c.held = body;
    try_answer(c);
  } else {
    throw CommError("rendezvous store: an unknown request");
  }
}

// Checks a hello. What is not a ztrain rank of this job (another program,
// a scanner, a process without the job's token) is dropped and logged: it
// must not end the job. A rank that is refused (another WORLD_SIZE, a rank
// already claimed) is told why; during the meeting that also fails the job,
// since those ranks were started wrong.
void StoreServer::hello(Conn& c, const std::vector<char>& body) {
  Reader r(body);
  if (body[0] != kHello || body.size() < 21 || r.u32() != kMagic)
    return drop(c, "that is not a ztrain rank (or one of another ztrain version)", "");
  const auto link = static_cast<StoreLink>(r.u32());
  const std::uint32_t rank = r.u32(), world = r.u32();
  const std::uint32_t token_size = r.u32();
  if (token_size != body.size() - 21 || !same_token(r.bytes(token_size), token_))
    return drop(c, "without this job's ZTRAIN_JOB_TOKEN",
                "its ZTRAIN_JOB_TOKEN is not the job's (rank 0's)");
  std::string refusal;
  bool fails_job = false;
  {
    std::lock_guard lock(mu_);
    const auto& seen = link == StoreLink::beats ? beats_in_ : store_in_;
    if (!failed_.empty())
      refusal = failed_;
    else if (world != static_cast<std::uint32_t>(world_))
      refusal = "rank " + std::to_string(rank) + " says WORLD_SIZE=" + std::to_string(world) +
                ", rank 0 has WORLD_SIZE=" + std::to_string(world_);
    else if (rank >= world || seen[rank])
      refusal = "two processes claim RANK=" + std::to_string(rank);
    if (rank < told_.size()) told_[rank] = true;
    fails_job = !refusal.empty() && failed_.empty() && !all_arrived();
    if (!refusal.empty()) arrived_.notify_all();  // tell_latecomers counts the ranks told
  }
  if (!refusal.empty()) {
    refuse(c, refusal);
    c.last = true;
    if (fails_job) fail_job(refusal);
    return;
  }
  c.greeted = true;
  if (link == StoreLink::store) c.rank = static_cast<int>(rank);
  reply(c, "");
  // A beats link is handed to the watchdog whole: the accept frame leaves
  // first (outside the lock: it may take a moment).
  if (link == StoreLink::beats) {
    net::send_all(c.fd.get(), c.out.data(), c.out.size(),
                  net::Clock::now() + std::chrono::seconds(5), "rendezvous store");
    c.out.clear();
  }
  // The rank counts as arrived only with its link in place, so that
  // take_beats(), which may follow wait_arrivals() at once, finds it.
  std::lock_guard lock(mu_);
  (link == StoreLink::beats ? beats_in_ : store_in_)[rank] = true;
  if (const std::uint32_t peer = net::peer_addr_of(c.fd.get()); !net::loopback(peer) && !outside_)
    outside_ = net::local_addr_of(c.fd.get());
  if (link == StoreLink::beats) {
    beats_[rank] = std::move(c.fd);
    c.closed = true;
  }
  arrived_.notify_all();
}

void StoreServer::drop(Conn& c, const std::string& what, const std::string& answer) {
  if (answer.empty()) {
    c.closed = true;
  } else {
    refuse(c, answer);
    c.last = true;
  }
  if (++dropped_ > kDroppedShown) return;
  std::fprintf(stderr, "rank 0: dropped a connection to the meeting port from %s %s%s\n",
               net::dotted(net::peer_addr_of(c.fd.get())).c_str(), what.c_str(),
               dropped_ == kDroppedShown ? " (further ones are dropped without a word)" : "");
  std::fflush(stderr);
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

void StoreServer::reply(Conn& c, const std::string& value) {
  c.out += frame(std::string(1, kDone) + value);
}

void StoreServer::refuse(Conn& c, const std::string& why) {
  c.out += frame(std::string(1, kFailed) + why);
}

void StoreServer::lose(int rank) {
  if (rank == 0) return;  // rank 0's own link: this process is ending
  std::string why;
  {
    std::lock_guard lock(mu_);
    if (!failed_.empty()) return;
    why = "rank " + std::to_string(rank) + " closed its connection to rank 0 " + stage_of(rank) +
          ": it exited or died (its own output says why)";
  }
  fail_job(why);
}

void StoreServer::fail_job(const std::string& why) {
  {
    std::lock_guard lock(mu_);
    if (!failed_.empty()) return;
    failed_ = why;
    // A rank whose store link is open hears it: from its held or next
    // request, or from the link closing when rank 0 ends.
    for (std::size_t r = 0; r < told_.size(); ++r) told_[r] = told_[r] || store_in_[r];
    arrived_.notify_all();
  }
  for (auto& c : conns_)
    if (!c->closed && c->held) {
      c->held.reset();
      refuse(*c, why);
    }
}

void StoreServer::tell_latecomers(net::Clock::time_point until) {
  std::unique_lock lock(mu_);
  arrived_.wait_until(lock, until, [&] {
    return std::all_of(told_.begin() + 1, told_.end(), [](bool t) { return t; });
  });
}

std::string StoreServer::failed() const {
  std::lock_guard lock(mu_);
  return failed_;
}

bool StoreServer::arrived(int r) const {
  const auto i = static_cast<std::size_t>(r);
  return store_in_[i] && (r == 0 || beats_in_[i]);
}

bool StoreServer::all_arrived() const {
  for (int r = 0; r < world_; ++r)
    if (!arrived(r)) return false;
  return true;
}

std::string StoreServer::stage_of(int r) const {
  if (r != 0 && !beats_in_[static_cast<std::size_t>(r)])
    return "after joining the meeting, before opening its heartbeat link";
  if (!all_arrived()) return "while the ranks met";
  if (!published_[static_cast<std::size_t>(r)])
    return "after the meeting, before publishing its gloo address";
  return "after publishing its gloo address";
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
  for (;;) {
    if (!failed_.empty()) throw CommError("rank 0: " + failed_);
    if (all_arrived()) return;
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

namespace {

// One answer of the server: its value, or CommError with `what` and why:
// the server's reason after `failed` ("rank 0 refused this rank: "), or
// rank 0 having gone.
std::string read_answer(int fd, net::Clock::time_point until, const std::string& what,
                        const std::string& failed) {
  std::string answer;
  try {
    std::uint32_t n = 0;
    net::recv_all(fd, &n, 4, until, what);
    if (n == 0 || n > kMaxFrame) throw CommError(what + ": a malformed answer from rank 0");
    answer.resize(n);
    net::recv_all(fd, answer.data(), n, until, what);
  } catch (const net::PeerClosed&) {
    throw CommError(what +
                    ": rank 0 closed its connection: it exited or died (its output says why)");
  }
  if (answer[0] == kFailed) throw CommError(what + ": " + failed + answer.substr(1));
  return answer.substr(1);
}

}  // namespace

net::Fd join_store(const StoreAddress& at, int rank, int world, StoreLink link,
                   net::Clock::time_point until, const std::string& unreachable,
                   const net::WaitReport& waiting) {
  net::Fd fd = net::connect_to(at.addr, at.port, until, unreachable, waiting);
  const std::string who = "rank " + std::to_string(rank);
  std::string hello(1, kHello);
  for (std::uint32_t v :
       {kMagic, static_cast<std::uint32_t>(link), static_cast<std::uint32_t>(rank),
        static_cast<std::uint32_t>(world), static_cast<std::uint32_t>(at.token.size())})
    put_u32(hello, v);
  hello += at.token;
  const std::string f = frame(hello);
  net::send_all(fd.get(), f.data(), f.size(), until, unreachable);
  read_answer(fd.get(), until, who, "rank 0 refused this rank: ");
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
    try {
      net::send_all(fd_.get(), f.data(), f.size(), until, context);
    } catch (const net::PeerClosed&) {
      // Rank 0 has ended; why may still wait here (StoreServer::last_words).
    }
    return read_answer(fd_.get(), until, context, "");
  } catch (const CommError&) {
    fd_ = net::Fd();  // out of step with the server now
    throw;
  }
}

}  // namespace ztrain
