#include "checkpoint/tensor_parts.h"

#include <algorithm>

namespace ztrain {
namespace {

// Whether this rank stores parameter `spec`: every rank its own part, the
// group's first rank one held whole by all, the first of a copied part's
// holders that part.
bool writes(const ParamSpec& spec, int tensor_rank) {
  if (spec.split.dim < 0) return tensor_rank == 0;
  return tensor_rank % spec.split.copies == 0;
}

// f(part element, whole element, count) over [first, first + count) of a
// part, one run of consecutive whole elements at a time.
template <class F>
void for_runs(const ParamSpec& spec, std::uint64_t first, std::uint64_t count, F&& f) {
  for (std::uint64_t i = first; i < first + count;) {
    const std::uint64_t n = std::min(first + count - i, spec.split.run_length(spec.shape, i));
    f(i - first, spec.split.whole_index(spec.shape, i), n);
    i += n;
  }
}

}  // namespace

void WholeSink::put(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
                    const float* values) {
  const ParamSpec& spec = params_[p];
  if (!writes(spec, tensor_rank_) || spec.tied_copy) return;
  const ParamId id = spec.model_id.value_or(p);
  for_runs(spec, first, count, [&](std::uint64_t at, std::uint64_t whole, std::uint64_t n) {
    inner_.put(id, whole, n, a, values + at);
  });
}

void PartSource::get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
                     float* out) {
  const ParamSpec& spec = params_[p];
  const ParamId id = spec.model_id.value_or(p);
  for_runs(spec, first, count, [&](std::uint64_t at, std::uint64_t whole, std::uint64_t n) {
    inner_.get(id, whole, n, a, out + at);
  });
}

}  // namespace ztrain
