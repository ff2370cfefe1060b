// The rendezvous store torchrun-style ranks meet at, in one process: real
// sockets on loopback, the server and its clients as the ranks use them. A
// rank lost at any stage ends the others' waits at once, naming it and the
// stage; what is not a rank of the job is dropped without ending it; a
// refused rank fails the meeting and ranks arriving after that are told why.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "comm/rendezvous_store.h"
#include "support.h"

using namespace ztrain;

namespace {

using Clock = net::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

bool contains(const std::string& s, const std::string& part) {
  INFO("message: " << s);
  return s.find(part) != std::string::npos;
}

// A store server of `world` ranks on a free loopback port.
struct Server {
  Server(int world, const std::string& token) {
    net::Fd l = net::listen_on(htonl(INADDR_LOOPBACK), 0, "");
    sockaddr_in a{};
    socklen_t len = sizeof a;
    ::getsockname(l.get(), reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    std::vector<net::Fd> listeners;
    listeners.push_back(std::move(l));
    server = std::make_unique<StoreServer>(std::move(listeners), world, token);
  }
  net::Fd join(int rank, int world, StoreLink link, const std::string& token = "") const {
    return join_store({htonl(INADDR_LOOPBACK), port, token}, rank, world, link,
                      Clock::now() + seconds(10), "rank " + std::to_string(rank), {});
  }
  StoreClient client(int rank, int world) const {
    return StoreClient(join(rank, world, StoreLink::store), "rank " + std::to_string(rank),
                       seconds(30));
  }
  // The message wait_arrivals raises, and how long it took.
  std::pair<std::string, double> failed_meeting() const {
    const auto start = Clock::now();
    const std::string why = test::message_of<CommError>([&] {
      server->wait_arrivals(Clock::now() + seconds(30), [](double, const std::string&) {});
    });
    return {why, std::chrono::duration<double>(Clock::now() - start).count()};
  }
  std::uint16_t port = 0;
  std::unique_ptr<StoreServer> server;
};

}  // namespace

TEST_CASE("rendezvous: a rank lost while the ranks meet ends every wait at once, naming it") {
  Server s(3, "");
  StoreClient rank0 = s.client(0, 3);
  StoreClient rank1 = s.client(1, 3);
  net::Fd beats1 = s.join(1, 3, StoreLink::beats);
  auto rank1_waits = std::async(std::launch::async, [&] {
    return test::message_of<CommError>([&] { rank1.wait({"ztrain/met"}); });
  });
  {
    net::Fd rank2 = s.join(2, 3, StoreLink::store);  // joins, then dies before its heartbeat link
  }
  const auto [why, took] = s.failed_meeting();
  CHECK(contains(why,
                 "rank 2 closed its connection to rank 0 after joining the meeting, "
                 "before opening its heartbeat link"));
  CHECK(took < 2.0);
  REQUIRE(rank1_waits.wait_for(seconds(2)) == std::future_status::ready);
  CHECK(contains(rank1_waits.get(), "rank 2 closed its connection"));
  // A rank 2 that comes back is told the job failed.
  const std::string late = test::message_of<CommError>([&] { s.join(2, 3, StoreLink::store); });
  CHECK(contains(late, "rank 0 refused this rank: rank 2 closed its connection"));
}

TEST_CASE(
    "rendezvous: a rank lost with both links open, before the others came, names that stage") {
  Server s(3, "");
  StoreClient rank0 = s.client(0, 3);
  {
    net::Fd store = s.join(1, 3, StoreLink::store);
    net::Fd beats = s.join(1, 3, StoreLink::beats);
  }
  const auto [why, took] = s.failed_meeting();
  CHECK(contains(why, "rank 1 closed its connection to rank 0 while the ranks met"));
  CHECK(took < 2.0);
}

TEST_CASE(
    "rendezvous: a rank lost after the meeting fails the others' requests, naming its stage") {
  Server s(2, "");
  StoreClient rank0 = s.client(0, 2);
  net::Fd rank1_store = s.join(1, 2, StoreLink::store);
  net::Fd rank1_beats = s.join(1, 2, StoreLink::beats);
  s.server->wait_arrivals(Clock::now() + seconds(10), [](double, const std::string&) {});
  auto rank0_waits = std::async(std::launch::async, [&] {
    return test::message_of<CommError>([&] { rank0.get("ztrain/world/1"); });
  });
  std::this_thread::sleep_for(milliseconds(50));
  const auto start = Clock::now();
  rank1_store = net::Fd();
  REQUIRE(rank0_waits.wait_for(seconds(2)) == std::future_status::ready);
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 2.0);
  CHECK(contains(rank0_waits.get(),
                 "rank 1 closed its connection to rank 0 after the meeting, "
                 "before publishing its gloo address"));
  CHECK(contains(s.server->failed(), "rank 1"));
}

TEST_CASE("rendezvous: what is not a rank of the job is dropped without ending the meeting") {
  Server s(2, "job-secret");
  // Five bytes from anyone used to end the meeting; so did a well-formed
  // frame that is not a hello.
  const std::string framed_junk = std::string("\x11\0\0\0", 4) + std::string(17, 'x');
  for (const std::string& junk_bytes : {std::string("hello"), framed_junk}) {
    net::Fd junk =
        net::connect_to(htonl(INADDR_LOOPBACK), s.port, Clock::now() + seconds(5), "junk");
    net::send_all(junk.get(), junk_bytes.data(), junk_bytes.size(), Clock::now() + seconds(5),
                  "junk");
    // Dropped: closed (recv 0) within seconds, nothing answered.
    pollfd p{junk.get(), POLLIN, 0};
    CHECK(::poll(&p, 1, 5000) == 1);
    char byte = 0;
    CHECK(::recv(junk.get(), &byte, 1, 0) == 0);
  }
  const std::string stranger =
      test::message_of<CommError>([&] { s.join(1, 2, StoreLink::store, "guess"); });
  CHECK(contains(stranger, "ZTRAIN_JOB_TOKEN is not the job's"));
  const std::string none = test::message_of<CommError>([&] { s.join(1, 2, StoreLink::store); });
  CHECK(contains(none, "ZTRAIN_JOB_TOKEN"));
  CHECK(s.server->failed().empty());
  net::Fd rank0 = s.join(0, 2, StoreLink::store, "job-secret");
  net::Fd rank1 = s.join(1, 2, StoreLink::store, "job-secret");
  net::Fd beats1 = s.join(1, 2, StoreLink::beats, "job-secret");
  s.server->wait_arrivals(Clock::now() + seconds(10), [](double, const std::string&) {});
}

TEST_CASE("rendezvous: a refused rank fails the meeting, and ranks arriving later are told why") {
  Server s(3, "");
  net::Fd rank0 = s.join(0, 3, StoreLink::store);
  net::Fd rank1 = s.join(1, 3, StoreLink::store);
  const std::string twice = test::message_of<CommError>([&] { s.join(1, 3, StoreLink::store); });
  CHECK(contains(twice, "two processes claim RANK=1"));
  const auto [why, took] = s.failed_meeting();
  CHECK(contains(why, "two processes claim RANK=1"));
  // Rank 2 has not come: rank 0 waits for it, up to a bound, to tell it.
  auto told = std::async(std::launch::async, [&] {
    const auto start = Clock::now();
    s.server->tell_latecomers(Clock::now() + seconds(20));
    return std::chrono::duration<double>(Clock::now() - start).count();
  });
  CHECK(told.wait_for(milliseconds(300)) == std::future_status::timeout);
  const std::string late = test::message_of<CommError>([&] { s.join(2, 3, StoreLink::store); });
  CHECK(contains(late, "rank 0 refused this rank: two processes claim RANK=1"));
  REQUIRE(told.wait_for(seconds(5)) == std::future_status::ready);
  CHECK(told.get() < 5.0);
}

TEST_CASE("rendezvous: rank 0 ending after a lost rank tells the others which rank it lost") {
  auto s = std::make_unique<Server>(3, "");
  StoreClient rank0 = s->client(0, 3);
  net::Fd rank1_store = s->join(1, 3, StoreLink::store);
  net::Fd rank1_beats = s->join(1, 3, StoreLink::beats);
  StoreClient rank2 = s->client(2, 3);
  net::Fd rank2_beats = s->join(2, 3, StoreLink::beats);
  s->server->wait_arrivals(Clock::now() + seconds(10), [](double, const std::string&) {});
  rank1_store = net::Fd();  // rank 1 dies
  for (int i = 0; i < 200 && s->server->failed().empty(); ++i)
    std::this_thread::sleep_for(milliseconds(10));
  s.reset();  // rank 0 ends because of it
  // Rank 2 asks only now: the answer waiting in its connection names rank 1.
  const std::string why = test::message_of<CommError>([&] { rank2.get("ztrain/world/1"); });
  CHECK(contains(why, "rank 1 closed its connection to rank 0"));
}
