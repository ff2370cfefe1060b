// Parameter initialisation that does not depend on the layout.
//
// The value of element i of parameter p is a pure function of (seed, p, i):
// N(0, std^2) from a counter-based generator, or a constant. A strategy
// initialises whatever part of the flat buffer it owns and gets the same
// numbers a single process would.
//
// Thread safety: reentrant; uses the calling thread's oneTBB arena.
#pragma once

#include <cstdint>
#include <vector>

#include "ztrain/export.h"
#include "ztrain/kernels.h"
#include "ztrain/model.h"
#include "ztrain/shard/flat_layout.h"

namespace ztrain::shard {

// Writes the initial values of flat elements [begin, end) into dst (dst[0]
// is flat element `begin`); padding is zeroed.
ZTRAIN_API void init_flat(const std::vector<ParamSpec>& params, const FlatLayout& layout,
                          std::uint64_t seed, std::uint64_t begin, std::uint64_t end, float* dst);
// The same values rounded to dst's type (converted in slices, so a 16-bit
// buffer never needs an fp32 twin).
ZTRAIN_API void init_flat(const std::vector<ParamSpec>& params, const FlatLayout& layout,
                          std::uint64_t seed, std::uint64_t begin, std::uint64_t end, TypedPtr dst);

}  // namespace ztrain::shard
