// The optimizer state of a training run, element by element, as a
// checkpoint holds it.
//
// Whatever a strategy's layout (replicas, shards, parts offloaded to host
// memory or swap files), the state of every parameter element is the same
// three fp32 numbers: the master weight and AdamW's first and second
// moments. A checkpoint stores them per parameter, so a strategy saves and
// loads through parameter-relative element ranges and never through its own
// layout: the run that reads a checkpoint may have another world size and
// another strategy than the one that wrote it. The working copy is not
// stored: it is the master rounded to the working precision, which is what
// the optimizer writes after every step.
//
// StateSink receives what a rank saves; StateSource hands out what a rank
// loads, reading only the ranges asked for.
//
// Ownership: values are copied before put/get return.
// Errors: a sink raises DataError when it cannot write; a source raises
// DataError naming the file and range that is missing or corrupt.
// Thread safety: one caller at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ztrain/export.h"
#include "ztrain/model.h"

namespace ztrain {

enum class StateArray : std::uint8_t { master, m, v };
inline constexpr std::size_t kStateArrayCount = 3;
ZTRAIN_API std::string_view state_array_name(StateArray a);

class ZTRAIN_API StateSink {
 public:
  virtual ~StateSink();
  // Elements [first, first + count) of parameter p (flat, row-major).
  virtual void put(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
                   const float* values) = 0;
};

class ZTRAIN_API StateSource {
 public:
  virtual ~StateSource();
  virtual void get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
                   float* out) = 0;
};

}  // namespace ztrain
