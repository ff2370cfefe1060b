// How ranks started torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, no MPI) meet before gloo connects them: rank 0 serves the
// rendezvous store on MASTER_PORT (MASTER_PORT + 1 beside torchrun's agent
// store), every rank opens a store connection and, but rank 0, a heartbeat
// connection to it; rank 0 waits for every rank, saying every few seconds
// who is missing, then publishes the address other hosts reached it at;
// ranks keep trying to reach a rank 0 that is late. What comes out is what
// the gloo communicator needs: the store gloo's full mesh reads addresses
// from, the heartbeat links of the watchdog, and the address this rank's
// gloo device listens on (one other hosts can reach).
//
// Errors: CommError naming the variable that is missing or wrong, the
// ranks that never arrived, or what rank 0 refused. Part of the host.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/rendezvous_store.h"
#include "comm/socket.h"

namespace ztrain {

struct EnvRendezvous {
  int rank = 0, world = 1;
  std::shared_ptr<StoreServer> server;  // rank 0's; serves the store until the last user goes
  std::shared_ptr<StoreClient> store;
  std::vector<net::Fd> beats;  // per rank: the heartbeat links of this rank
  std::string address;         // dotted IPv4 address for this rank's gloo device
};

// timeout_s bounds the whole meeting.
EnvRendezvous meet_from_env(double timeout_s);

}  // namespace ztrain
