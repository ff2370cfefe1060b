#include "ztrain/shard/init.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <algorithm>
#include <vector>

#include "ztrain/random.h"

namespace ztrain::shard {

void initial_values(const ParamSpec& spec, std::uint64_t stream, std::uint64_t seed,
                    std::uint64_t first, std::uint64_t count, float* out) {
  if (spec.model_id) stream = index_of(*spec.model_id);
  const auto draw = [&](auto value) {
    oneapi::tbb::parallel_for(
        oneapi::tbb::blocked_range<std::uint64_t>(0, count, 4096),
        [&](const oneapi::tbb::blocked_range<std::uint64_t>& r) {
          for (auto i = r.begin(); i != r.end(); ++i)
            out[i] = static_cast<float>(value(spec.split.whole_index(spec.shape, first + i)));
        });
  };
  const double scale = spec.init.std;
  switch (spec.init.kind) {
    case Init::Kind::zeros:
      return std::fill(out, out + count, 0.0f);
    case Init::Kind::ones:
      return std::fill(out, out + count, 1.0f);
    case Init::Kind::normal:
      return draw([&](std::uint64_t i) { return scale * normal_at(seed, stream, i); });
    case Init::Kind::uniform:
      return draw([&](std::uint64_t i) { return scale * symmetric_uniform_at(seed, stream, i); });
  }
}

void init_flat(const ParamSpecs& params, const FlatLayout& layout, std::uint64_t seed,
               std::uint64_t begin, std::uint64_t end, float* dst) {
  std::fill(dst, dst + (end - begin), 0.0f);
  for (const auto& seg : layout.segments(begin, end))
    initial_values(params[seg.param], static_cast<std::uint64_t>(seg.param), seed,
                   seg.begin - layout.offset(seg.param), seg.end - seg.begin,
                   dst + (seg.begin - begin));
}

void init_flat(const ParamSpecs& params, const FlatLayout& layout, std::uint64_t seed,
               std::uint64_t begin, std::uint64_t end, TypedPtr dst, Device& device, Tier tier) {
  if (dst.dtype == DType::f32 && device.host_visible(tier))
    return init_flat(params, layout, seed, begin, end, static_cast<float*>(dst.data));
  constexpr std::uint64_t kSlice = 1 << 20;
  std::vector<float> slice(std::min(kSlice, end - begin));
  for (std::uint64_t b = begin; b < end; b += kSlice) {
    const std::uint64_t e = std::min(end, b + kSlice);
    init_flat(params, layout, seed, b, e, slice.data());
    device.convert(dst.at(b - begin), slice.data(), e - b);
  }
}

}  // namespace ztrain::shard
