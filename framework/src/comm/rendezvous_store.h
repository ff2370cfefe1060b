// The key-value store torchrun-style ranks meet through: rank 0 serves it
// at MASTER_ADDR:MASTER_PORT, every rank (rank 0 included) talks to it
// through a StoreClient, which is the gloo::rendezvous::Store that gloo's
// full-mesh connection reads peer addresses from. This is the only socket
// protocol ztrain keeps: gloo moves every collective's bytes.
//
// A connection opens with a hello (magic, kind, rank, world, the job's
// token). A `store` connection then sends requests: set a key, get a key
// (answered when the key exists), wait for keys. A `beats` connection is
// handed over whole to rank 0's watchdog (tcp_beats.h), so a rank's death
// closes it at once. The server drops, and names on its output, what is
// not a ztrain rank of this job (another program, a process without the
// job's token); it refuses a rank that claims a rank already taken or
// another WORLD_SIZE, which during the meeting fails the job. A rank whose
// store link closes is lost, which fails the job too. Once failed, every
// request of the others and every later hello is answered with why, naming
// the rank and the stage it had reached, so that no rank waits for one that
// has gone.
//
// Threads: the server runs one thread of its own (a poll loop); its other
// members may be called from any thread. A client serialises its requests
// (one at a time per connection) and may be shared between threads.
// Errors: CommError naming the rank, the request and what went wrong.
// Part of the host.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/socket.h"

namespace ztrain {

enum class StoreLink : std::uint32_t { store = 1, beats = 2 };

class StoreServer {
 public:
  // Serves on `listeners` (already listening) a job of `world` ranks whose
  // hellos carry `token` (ZTRAIN_JOB_TOKEN; empty: none).
  StoreServer(std::vector<net::Fd> listeners, int world, std::string token);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Waits until every rank has opened its store and beats connections
  // (rank 0: its store connection), calling `report` every
  // net::kWaitReportEvery with the ranks still missing. Raises CommError on
  // a refused hello, a lost rank, or at `until` naming the ranks that
  // never came.
  using MissingReport = std::function<void(double waited_s, const std::string& missing)>;
  void wait_arrivals(net::Clock::time_point until, const MissingReport& report);
  // The address (network order) a rank on another host reached this one
  // at; 0 when every rank came over loopback.
  std::uint32_t outside_address() const;
  // The beats connections, one per rank (rank 0's entry empty); once.
  std::vector<net::Fd> take_beats();
  // Why the job cannot go on ("rank 2 closed its connection to rank 0
  // while the ranks met: ...", "two processes claim RANK=1"); empty while
  // it can.
  std::string failed() const;
  // After a failed meeting: waits until every rank has heard why (its link
  // was open, or it was refused since) or until `until`, so that a rank
  // started a little late is told instead of waiting for a rank 0 that has
  // gone.
  void tell_latecomers(net::Clock::time_point until);

 private:
  struct Conn;
  void loop();
  void accept_new(int listener);
  bool read_from(Conn& c);
  void handle(Conn& c, const std::vector<char>& body);
  void hello(Conn& c, const std::vector<char>& body);
  bool try_answer(Conn& c);
  void reply(Conn& c, const std::string& value);
  void refuse(Conn& c, const std::string& why);
  // Ends a connection that is not a rank of this job, answering `answer`
  // first unless empty, and says so on rank 0's output.
  void drop(Conn& c, const std::string& what, const std::string& answer);
  // The loop's thread: rank's store link closed; the job cannot go on.
  void lose(int rank);
  void fail_job(const std::string& why);
  // The destructor's, after the loop has stopped.
  void last_words();
  // Under mu_: rank r opened its store connection and (but rank 0) its
  // beats connection; every rank did; the ranks that have not, as messages
  // list them; how far rank r had come, as a lost rank's message says it.
  bool arrived(int r) const;
  bool all_arrived() const;
  std::string missing_ranks() const;
  std::string stage_of(int r) const;

  const std::vector<net::Fd> listeners_;
  net::Fd wake_read_, wake_write_;
  const int world_;
  const std::string token_;
  int dropped_ = 0;  // the loop's thread only
  mutable std::mutex mu_;
  std::condition_variable arrived_;
  std::vector<std::unique_ptr<Conn>> conns_;  // the loop's thread only
  std::map<std::string, std::string> data_;   // the loop's thread only
  std::vector<bool> store_in_, beats_in_, published_;
  std::vector<bool> told_;  // after a failure: the rank knows (rank 0: itself)
  std::vector<net::Fd> beats_;
  std::string failed_;
  std::uint32_t outside_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

// Where rank 0's store is, and the token a hello carries.
struct StoreAddress {
  std::uint32_t addr;  // network order
  std::uint16_t port;
  std::string token;
};

// Connects to the store as `rank` of `world` and says hello, retrying until
// `until` (rank 0 may not listen yet) and calling `waiting` now and then
// while it cannot. `unreachable` begins the message when it cannot reach
// rank 0 by then. Raises CommError when the server refuses the hello,
// saying why.
net::Fd join_store(const StoreAddress& at, int rank, int world, StoreLink link,
                   net::Clock::time_point until, const std::string& unreachable,
                   const net::WaitReport& waiting);

class StoreClient final : public gloo::rendezvous::Store {
 public:
  // fd: a store link from join_store. timeout bounds get() and wait()
  // without a timeout of their own.
  StoreClient(net::Fd fd, std::string who, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  void set_timeout(std::chrono::milliseconds timeout);
  // The connection's own end: the address this host reached rank 0 at.
  std::uint32_t local_address() const;

 private:
  void wait_for(const std::vector<std::string>& keys,
                std::optional<std::chrono::milliseconds> timeout);
  // Sends one request and returns the answer; no timeout: the client's.
  std::string request(const std::string& body, std::optional<std::chrono::milliseconds> timeout,
                      const std::string& what);

  std::mutex mu_;
  net::Fd fd_;
  const std::string who_;
  std::chrono::milliseconds timeout_;
};

}  // namespace ztrain
