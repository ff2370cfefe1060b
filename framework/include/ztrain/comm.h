// Collective communication between the ranks of a job.
//
// A Communicator connects `size()` ranks. Collectives are called by every
// rank in the same order with matching arguments; buffers live in the memory
// the backend works on (host for mpi, device for nccl). Reduction ops sum or
// average. A collective that cannot complete raises CommError naming the
// operation and the rank.
//
// The `local` backend (world 1) needs no MPI: every collective is an
// identity (or a copy), so single-process runs pay nothing for the
// interface.
//
// Thread safety: one thread issues collectives on a communicator.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "ztrain/dtype.h"
#include "ztrain/export.h"

namespace ztrain {

enum class ReduceOp : std::uint8_t { sum, average };

class ZTRAIN_API Communicator {
 public:
  virtual ~Communicator();
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // In place over count elements.
  virtual void all_reduce(void* data, std::size_t count, DType type, ReduceOp op) = 0;
  // root's count elements copied to every rank.
  virtual void broadcast(void* data, std::size_t count, DType type, int root) = 0;
  virtual void barrier() = 0;
};

ZTRAIN_API std::unique_ptr<Communicator> make_local_communicator();

}  // namespace ztrain
