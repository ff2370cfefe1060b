// The links between a rank's pipeline stage and its neighbours: one
// two-rank communicator per direction and neighbour, so that a send never
// waits for the other direction's traffic.
//
// A schedule's plan (ztrain/pipeline/schedule.h) is checked on the terms
// that a send never waits and that one direction's messages between two
// stages arrive in order. Each link here is its own communicator, with its
// own worker (mpi, gloo, shared memory) or stream (nccl), carrying one
// direction between two stages: a send is a broadcast from the sender
// issued without waiting (its buffer is the caller's until the work is
// done), a receive is the same broadcast on the receiver, waited for. So
// the messages of a link are matched in the order both sides issue them,
// which the plan's check proves is the same order, and a sender blocked
// in its transport (a rendezvous of a large message) blocks only that
// link, never the receive the schedule does next. The bytes are counted as
// the broadcasts they are: the sender's n elements, the receiver's none.
//
// Links: activations go to the next stage (from the last stage to the
// first as well where the stages hold several chunks: interleaving),
// gradients to the previous (from the first to the last likewise). A tied
// parameter's stages (an embedding and the head tied to it) get a group of
// their own, whose all-reduce sums the two gradients.
//
// Ownership: the links belong to StageLinks; they are splits of the
// pipeline group and must not outlive it. Thread safety: one thread uses
// them. Errors: CommError from the splits and transfers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ztrain/comm.h"

namespace ztrain {

class StageLinks {
 public:
  // Collective over `pipeline` (every stage makes its links alike): wraps
  // for interleaved schedules; tied_sets: the stages holding each tied
  // parameter set (two or more stages each), in the same order on every
  // stage.
  StageLinks(Communicator& pipeline, bool wraps,
             const std::vector<std::vector<std::size_t>>& tied_sets);
  // n floats to the next stage; the buffer must stay until wait().
  CommWork send_activation(const float* data, std::size_t n);
  // n floats from the previous stage, waited for.
  void recv_activation(float* data, std::size_t n);
  CommWork send_gradient(const float* data, std::size_t n);
  void recv_gradient(float* data, std::size_t n);
  // The group of the stages holding tied set i; null where this stage is
  // not one of them.
  Communicator* tied(std::size_t i) const { return tied_.at(i).get(); }

 private:
  std::unique_ptr<Communicator> activation_out_, activation_in_, gradient_out_, gradient_in_;
  std::vector<std::unique_ptr<Communicator>> tied_;
};

// Every stage's fingerprint of what must be alike on all of them (the
// step's plan, the model's modules, the micro-batch's shape: `what`)
// gathered and compared, so a stage that would wait for a message its
// neighbour never sends stops the job before step 1 instead. ConfigError
// on every stage naming the first two that differ. Collective over
// `pipeline`.
void check_stages_agree(Communicator& pipeline, std::uint64_t fingerprint, const std::string& what);

}  // namespace ztrain
