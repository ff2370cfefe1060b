// Checkpoint state of a flat range: between a strategy's layout and the
// parameter-relative ranges a checkpoint stores (ztrain/optimizer_state.h).
//
// A flat range [begin, end) of a FlatLayout covers pieces of consecutive
// parameters and the padding between them. put_range hands each piece to
// the sink under its parameter and element offset; get_range fills each
// piece from the source and zeroes the padding, which is never stored.
// Pointers are at element `begin`. A ClippedSink passes on only the part
// of each put inside one flat range: ranks holding the same state (copies
// of one shard) each save a different part of it, so that together they
// save it once.
//
// Errors: those of the sink or source.
// Thread safety: as the sink's or source's.
#pragma once

#include <cstdint>

#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/optimizer_state.h"
#include "ztrain/shard/flat_layout.h"

namespace ztrain::shard {

ZTRAIN_API void put_range(StateSink& sink, const FlatLayout& layout, std::uint64_t begin,
                          std::uint64_t end, StateArray a, const float* values);
ZTRAIN_API void get_range(StateSource& source, const FlatLayout& layout, std::uint64_t begin,
                          std::uint64_t end, StateArray a, float* out);

// The same for state in `tier` of `device`, which the host may not reach
// (a GPU's memory): sinks and sources take host memory, so the values pass
// through a host buffer of at most 4M elements at a time; where the tier is
// host-visible these are the functions above.
ZTRAIN_API void put_range(StateSink& sink, const FlatLayout& layout, std::uint64_t begin,
                          std::uint64_t end, StateArray a, const float* values, Device& device,
                          Tier tier);
ZTRAIN_API void get_range(StateSource& source, const FlatLayout& layout, std::uint64_t begin,
                          std::uint64_t end, StateArray a, float* out, Device& device, Tier tier);

// Forwards to `sink` the elements of each put that lie in flat [begin, end)
// of `layout`. Holds references: sink and layout outlive it.
class ZTRAIN_API ClippedSink final : public StateSink {
 public:
  ClippedSink(StateSink& sink, const FlatLayout& layout, std::uint64_t begin, std::uint64_t end)
      : sink_(sink), layout_(layout), begin_(begin), end_(end) {}
  void put(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
           const float* values) override;

 private:
  StateSink& sink_;
  const FlatLayout& layout_;
  std::uint64_t begin_, end_;
};

}  // namespace ztrain::shard
