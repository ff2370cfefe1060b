#include "ztrain/shard/init.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <algorithm>
#include <vector>

#include "ztrain/random.h"

namespace ztrain::shard {

void init_flat(const ParamSpecs& params, const FlatLayout& layout, std::uint64_t seed,
               std::uint64_t begin, std::uint64_t end, float* dst) {
  std::fill(dst, dst + (end - begin), 0.0f);
  for (const auto& seg : layout.segments(begin, end)) {
    const ParamSpec& spec = params[seg.param];
    const std::uint64_t base = layout.offset(seg.param);
    float* out = dst + (seg.begin - begin);
    const std::uint64_t n = seg.end - seg.begin;
    switch (spec.init.kind) {
      case Init::Kind::zeros:
        break;
      case Init::Kind::ones:
        std::fill(out, out + n, 1.0f);
        break;
      case Init::Kind::normal: {
        const double stddev = spec.init.std;
        const std::uint64_t first = seg.begin - base;
        oneapi::tbb::parallel_for(
            oneapi::tbb::blocked_range<std::uint64_t>(0, n, 4096),
            [&](const oneapi::tbb::blocked_range<std::uint64_t>& r) {
              for (auto i = r.begin(); i != r.end(); ++i)
                out[i] = static_cast<float>(
                    stddev * normal_at(seed, static_cast<std::uint64_t>(seg.param), first + i));
            });
        break;
      }
    }
  }
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
