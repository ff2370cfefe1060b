// Heartbeats of torchrun-style launches: fixed-size frames on the beats
// connections the ranks opened to rank 0's rendezvous store when they met
// (rank 0 holds one per rank, the others one to rank 0). A peer that exits or dies closes its
// connection, which the watchdog hears at once; a frozen one just stops
// beating. Part of the host.
#pragma once

#include <memory>
#include <vector>

#include "comm/socket.h"
#include "comm/watchdog.h"

namespace ztrain {

// control: one entry per rank, connected where there is a control
// connection to that rank, empty elsewhere.
std::unique_ptr<Watchdog::Transport> make_tcp_beats(std::vector<net::Fd> control);

}  // namespace ztrain
