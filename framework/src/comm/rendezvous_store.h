// The key-value store torchrun-style ranks meet through: rank 0 serves it
// at MASTER_ADDR:MASTER_PORT, every rank (rank 0 included) talks to it
// through a StoreClient, which is the gloo::rendezvous::Store that gloo's
// full-mesh connection reads peer addresses from. This is the only socket
// protocol ztrain keeps: gloo moves every collective's bytes.
//
// A connection opens with a hello (magic, kind, rank, world). A `store`
// connection then sends requests: set a key, get a key (answered when the
// key exists), wait for keys. A `beats` connection is handed over whole to
// rank 0's watchdog (tcp_beats.h), so a rank's death closes it at once.
// The server checks every hello (a ztrain rank, the same WORLD_SIZE, a
// rank claimed once) and records what it refused, which rank 0's
// wait_arrivals() then reports.
//
// Threads: the server runs one thread of its own (a poll loop); its other
// members may be called from any thread. A client serialises its requests
// (one at a time per connection) and may be shared between threads.
// Errors: CommError naming the rank, the request and what went wrong.
// Internal to libztrain.
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
  // Serves on `listener` (already listening) a job of `world` ranks.
  StoreServer(net::Fd listener, int world);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Waits until every rank has opened its store and beats connections
  // (rank 0: its store connection), calling `report` every
  // net::kWaitReportEvery with the ranks still missing. Raises CommError on
  // a refused hello, or at `until` naming the ranks that never came.
  using MissingReport = std::function<void(double waited_s, const std::string& missing)>;
  void wait_arrivals(net::Clock::time_point until, const MissingReport& report);
  // The address (network order) a rank on another host reached this one
  // at; 0 when every rank came over loopback.
  std::uint32_t outside_address() const;
  // The beats connections, one per rank (rank 0's entry empty); once.
  std::vector<net::Fd> take_beats();

 private:
  struct Conn;
  void loop();
  void accept_new();
  bool read_from(Conn& c);
  void handle(Conn& c, const std::vector<char>& body);
  void hello(Conn& c, const std::vector<char>& body);
  bool try_answer(Conn& c);
  void reply(Conn& c, const std::string& body);
  // Under mu_: rank r opened its store connection and (but rank 0) its
  // beats connection; the ranks that have not, as messages list them.
  bool arrived(int r) const;
  std::string missing_ranks() const;

  net::Fd listener_, wake_read_, wake_write_;
  const int world_;
  mutable std::mutex mu_;
  std::condition_variable arrived_;
  std::vector<std::unique_ptr<Conn>> conns_;  // the loop's thread only
  std::map<std::string, std::string> data_;   // the loop's thread only
  std::vector<bool> store_in_, beats_in_;
  std::vector<net::Fd> beats_;
  std::string refused_;
  std::uint32_t outside_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

// Connects to the store at addr:port as `rank` of `world` and says hello,
// retrying until `until` (rank 0 may not listen yet) and calling `waiting`
// now and then while it cannot. `who` names this rank in messages. Raises
// CommError when the server refuses the hello, saying why.
net::Fd join_store(std::uint32_t addr, std::uint16_t port, int rank, int world, StoreLink link,
                   net::Clock::time_point until, const std::string& who,
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
