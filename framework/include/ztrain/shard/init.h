// Parameter initialisation that does not depend on the layout.
//
// The value of element i of parameter p is a pure function of (seed, p, i):
// N(0, std^2) from a counter-based generator, or a constant. A strategy
// initialises whatever part of the flat buffer it owns and gets the same
// numbers a single process would; a tensor-parallel part (ParamSpec::split)
// gets the values of the whole parameter's elements it holds.
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

// The initial values of elements [first, first + count) of parameter
// `spec`, drawn from stream `stream` (its id in the model's list; a
// pipeline stage's parameter draws from its ParamSpec::model_id instead,
// so every mesh starts from the same values) under `seed`, into out: what
// init_flat writes at those elements.
ZTRAIN_API void initial_values(const ParamSpec& spec, std::uint64_t stream, std::uint64_t seed,
                               std::uint64_t first, std::uint64_t count, float* out);
// Writes the initial values of flat elements [begin, end) into dst (dst[0]
// is flat element `begin`); padding is zeroed.
ZTRAIN_API void init_flat(const ParamSpecs& params, const FlatLayout& layout, std::uint64_t seed,
                          std::uint64_t begin, std::uint64_t end, float* dst);
// The same values in dst's type, written where dst lives (`tier` of
// `device`): in place when it is fp32 the host can touch, else drawn into
// host slices and converted into dst slice by slice (Device::convert), so
// neither a 16-bit buffer nor a GPU's memory needs a whole fp32 twin.
ZTRAIN_API void init_flat(const ParamSpecs& params, const FlatLayout& layout, std::uint64_t seed,
                          std::uint64_t begin, std::uint64_t end, TypedPtr dst, Device& device,
                          Tier tier);

}  // namespace ztrain::shard
