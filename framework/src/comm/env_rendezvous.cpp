#include "comm/env_rendezvous.h"

#include <algorithm>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "comm/start_faults.h"
#include "comm/world.h"
#include "core/hold_points.h"
#include "ztrain/comm.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

// How long a rank waits for rank 0 to take its heartbeat link once rank 0
// has taken its store link.
constexpr std::chrono::seconds kBeatsJoin{5};

// How long rank 0 waits, after the meeting failed, for the ranks that have
// not arrived yet, to tell them why: ranks a scheduler starts together
// arrive within seconds of each other.
constexpr std::chrono::seconds kTellLatecomers{10};

// The key rank 0 sets once every rank has arrived; its value is the
// address ranks on other hosts reached rank 0 at (empty: all on one host).
constexpr const char* kMetKey = "ztrain/met";

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v)
    throw CommError(std::string(name) +
                    " is not set: the gloo backend joins ranks started torchrun-style (RANK, "
                    "WORLD_SIZE, MASTER_ADDR, MASTER_PORT); with [comm] backend = \"auto\" a "
                    "process started alone trains alone");
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end || x < 0 || x > 1 << 20)
    throw CommError(std::string(name) + "=" + v + " is not a non-negative integer");
  return static_cast<int>(x);
}

// Where the ranks meet, as the environment says.
struct Meeting {
  int rank, world;
  std::string master;  // MASTER_ADDR
  std::uint32_t master_addr;
  std::uint16_t port;
  std::string port_name;  // what messages call the port
  std::string token;      // ZTRAIN_JOB_TOKEN
  net::Clock::time_point until;
  std::string who;  // "rank R"
};

Meeting meeting_from_env(double timeout_s) {
  Meeting m;
  m.world = env_int("WORLD_SIZE");
  m.rank = env_int("RANK");
  if (m.world < 1 || m.rank >= m.world)
    throw CommError("RANK=" + std::to_string(m.rank) +
                    " is outside WORLD_SIZE=" + std::to_string(m.world));
  const char* master = std::getenv("MASTER_ADDR");
  const char* port_text = std::getenv("MASTER_PORT");
  if (!master || !port_text)
    throw CommError(
        "a RANK/WORLD_SIZE launch needs MASTER_ADDR and MASTER_PORT (rank 0's "
        "address and a free port on it), as torchrun sets them");
  // torchrun's agent keeps its own store on MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE): the ranks meet on the port after it.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool beside_agent = agent_store && std::string(agent_store) == "True";
  const int port = env_int("MASTER_PORT") + (beside_agent ? 1 : 0);
  m.port_name =
      std::to_string(port) + (beside_agent ? " (MASTER_PORT + 1, beside torchrun's store)" : "");
  if (port < 1 || port > 65535)
    throw CommError("MASTER_PORT=" + std::string(port_text) + ": port " + m.port_name +
                    " is not usable; choose another MASTER_PORT");
  m.port = static_cast<std::uint16_t>(port);
  m.master = master;
  m.master_addr = net::resolve(master);
  const char* token = std::getenv("ZTRAIN_JOB_TOKEN");
  m.token = token ? token : "";
  m.until = net::Clock::now() + std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  m.who = "rank " + std::to_string(m.rank);
  return m;
}

// Rank 0's store listens where MASTER_ADDR points, so that a job meeting
// at 127.0.0.1 cannot be reached from the network, and on loopback for the
// ranks of this host that reach it there; ZTRAIN_STORE_LISTEN=all asks for
// every interface (rank 0 behind NAT, say). A job that spans hosts cannot
// meet at a loopback address: given as one, that is an error; given as a
// host name that resolves to loopback only here (Debian's 127.0.1.1), the
// other hosts reach the name at an address this host cannot know, so the
// store listens on every interface and says so.
std::vector<net::Fd> store_listeners(const Meeting& m) {
  const std::string hint =
      "MASTER_ADDR must name rank 0's host (one of its addresses) and MASTER_PORT be free there "
      "(under torchrun's agent store, ztrain meets on MASTER_PORT + 1); ZTRAIN_STORE_LISTEN=all "
      "listens on every interface";
  const char* mode = std::getenv("ZTRAIN_STORE_LISTEN");
  if (mode && *mode && std::string(mode) != "all")
    throw CommError("ZTRAIN_STORE_LISTEN=" + std::string(mode) +
                    ": expected \"all\" (every interface), or unset to listen at MASTER_ADDR");
  const char* local_text = std::getenv("LOCAL_WORLD_SIZE");
  const int local = local_text ? std::atoi(local_text) : 0;
  const bool across_hosts = net::loopback(m.master_addr) && local > 0 && m.world > local;
  in_addr literal{};
  if (across_hosts && ::inet_pton(AF_INET, m.master.c_str(), &literal) == 1 && !mode)
    throw CommError("MASTER_ADDR=" + m.master +
                    " is a loopback address, which ranks on other hosts cannot reach, yet "
                    "WORLD_SIZE=" +
                    std::to_string(m.world) + " spans more than the " +
                    "LOCAL_WORLD_SIZE=" + std::to_string(local) +
                    " ranks of rank 0's host: set "
                    "MASTER_ADDR to an address of rank 0's host that the other hosts reach");
  std::vector<net::Fd> out;
  if (mode || across_hosts) {
    if (!mode)
      std::fprintf(stderr,
                   "rank 0: MASTER_ADDR=%s resolves to %s here, a loopback address, but the job "
                   "spans hosts, which reach this host by that name elsewhere: the meeting "
                   "port listens on every interface (set MASTER_ADDR to this host's address to "
                   "narrow it)\n",
                   m.master.c_str(), net::dotted(m.master_addr).c_str());
    out.push_back(net::listen_on(htonl(INADDR_ANY), m.port, hint));
    return out;
  }
  out.push_back(net::listen_on(m.master_addr, m.port, hint));
  if (!net::loopback(m.master_addr))
    out.push_back(net::listen_on(htonl(INADDR_LOOPBACK), m.port, hint));
  return out;
}

// Rank 0: everyone is here; tell them where other hosts reach this one.
// A meeting that failed is held open a little longer for the ranks that
// have not come yet, which are then told why instead of trying to reach a
// rank 0 that has gone until their timeout.
std::string hold_meeting(const Meeting& m, StoreServer& server, StoreClient& store) {
  const StoreServer::MissingReport missing = [&](double waited, const std::string& who) {
    std::fprintf(stderr,
                 "%s: waiting at port %s for %s, not arrived after %.0f s; giving up after "
                 "[comm] timeout\n",
                 m.who.c_str(), m.port_name.c_str(), who.c_str(), waited);
    std::fflush(stderr);
  };
  try {
    server.wait_arrivals(m.until, missing);
  } catch (const CommError&) {
    server.tell_latecomers(std::min(m.until, net::Clock::now() + kTellLatecomers));
    throw;
  }
  const std::uint32_t outside = server.outside_address();
  const std::string text = outside ? net::dotted(outside) : "";
  store.set(kMetKey, {text.begin(), text.end()});
  return text;
}

// Ranks > 0: wait for rank 0 to see everyone; the address it was reached at.
// The wait ends early when rank 0 lost a rank (the store's answer names it)
// or rank 0 itself went (the link closes).
std::string await_meeting(const Meeting& m, StoreClient& store) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(m.until - net::Clock::now());
  try {
    store.wait({kMetKey}, std::max(left, std::chrono::milliseconds(1)));
    const std::vector<char> v = store.get(kMetKey);
    return {v.begin(), v.end()};
  } catch (const CommError& e) {
    throw CommError(std::string(e.what()) +
                    " (while the ranks met; rank 0's output says which rank failed or never "
                    "arrived)");
  }
}

}  // namespace

bool launched_by_env() {
  const char* w = std::getenv("WORLD_SIZE");
  return w && std::atoi(w) > 1 && std::getenv("RANK");
}

EnvRendezvous meet_from_env(double timeout_s) {
  const Meeting m = meeting_from_env(timeout_s);
  EnvRendezvous out;
  out.rank = m.rank;
  out.world = m.world;
  if (m.rank == 0) out.server = std::make_shared<StoreServer>(store_listeners(m), m.world, m.token);
  const net::WaitReport waiting = [&](double waited) {
    std::fprintf(stderr,
                 "%s: rank 0 is not listening at %s, port %s, after %.0f s; still trying until "
                 "[comm] timeout\n",
                 m.who.c_str(), m.master.c_str(), m.port_name.c_str(), waited);
    std::fflush(stderr);
  };
  // Rank 0 reaches its own store over loopback.
  const StoreAddress at{
      m.rank == 0 && !net::loopback(m.master_addr) ? htonl(INADDR_LOOPBACK) : m.master_addr, m.port,
      m.token};
  const std::string reach =
      m.who + ": cannot reach rank 0 at " + m.master + ", port " + m.port_name;
  const auto timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  out.store = std::make_shared<StoreClient>(
      join_store(at, m.rank, m.world, StoreLink::store, m.until, reach, waiting), m.who, timeout);
  start_fault_point("store", m.rank);
  out.beats.resize(static_cast<std::size_t>(m.world));
  // Rank 0 accepted the store link, so it is listening: a heartbeat link it
  // does not take within seconds means it has gone (it refused another
  // process, say), not that it is late. Waiting for it until the meeting's
  // timeout would keep this rank alive for minutes after the job failed.
  if (m.rank > 0)
    out.beats[0] = join_store(at, m.rank, m.world, StoreLink::beats,
                              std::min(m.until, net::Clock::now() + kBeatsJoin),
                              m.who + ": rank 0 accepted this rank, then stopped answering at " +
                                  m.master + ", port " + m.port_name + " (its output says why)",
                              [](double) {});
  start_fault_point("beats", m.rank);
  const std::string outside =
      m.rank == 0 ? hold_meeting(m, *out.server, *out.store) : await_meeting(m, *out.store);
  if (m.rank == 0) out.beats = out.server->take_beats();
  start_fault_point("met", m.rank);
  hold_point("meeting_met");
  // A rank on rank 0's host may have reached it over loopback (MASTER_ADDR
  // 127.0.0.1, or a host name this host resolves to 127.0.1.1): ranks on
  // other hosts reach this host at the address they reached rank 0 at.
  const std::uint32_t own = m.rank == 0 ? htonl(INADDR_LOOPBACK) : out.store->local_address();
  out.address = net::loopback(own) && !outside.empty() ? outside : net::dotted(own);
  return out;
}

}  // namespace ztrain
