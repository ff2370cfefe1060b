#include "ztrain/shard/flat_layout.h"

#include <algorithm>

#include "ztrain/error.h"

namespace ztrain::shard {

FlatLayout::FlatLayout(const std::vector<ParamSpec>& params, int world, std::uint64_t align)
    : world_(world) {
  if (world < 1) throw InternalError("FlatLayout: world size must be >= 1");
  if (align == 0) throw InternalError("FlatLayout: alignment must be >= 1");
  std::uint64_t pos = 0;
  for (const auto& p : params) {
    pos = (pos + align - 1) / align * align;
    offsets_.push_back(pos);
    numels_.push_back(static_cast<std::uint64_t>(p.shape.numel()));
    pos += numels_.back();
  }
  const std::uint64_t unit = align * static_cast<std::uint64_t>(world);
  total_ = std::max<std::uint64_t>(unit, (pos + unit - 1) / unit * unit);
  shard_ = total_ / static_cast<std::uint64_t>(world);
}

std::vector<Segment> FlatLayout::segments(std::uint64_t begin, std::uint64_t end) const {
  std::vector<Segment> out;
  for (std::size_t p = 0; p < offsets_.size(); ++p) {
    const std::uint64_t b = std::max(begin, offsets_[p]);
    const std::uint64_t e = std::min(end, offsets_[p] + numels_[p]);
    if (b < e) out.push_back({static_cast<ParamId>(p), b, e});
  }
  return out;
}

}  // namespace ztrain::shard

namespace ztrain::shard {

std::vector<std::size_t> FlatLayout::owned_counts(std::uint64_t begin, std::uint64_t end) const {
  std::vector<std::size_t> counts;
  for (int r = 0; r < world_; ++r) {
    const std::uint64_t b = std::max(begin, owned_begin(r)), e = std::min(end, owned_end(r));
    counts.push_back(b < e ? static_cast<std::size_t>(e - b) : 0);
  }
  return counts;
}

std::vector<BucketRange> reverse_buckets(const FlatLayout& layout,
                                         const std::vector<ParamSpec>& params,
                                         std::uint64_t bucket_elements,
                                         std::uint64_t first_elements,
                                         std::vector<int>& bucket_of) {
  // The module whose backward completes each parameter's gradient.
  std::vector<ModuleId> done_by(params.size(), 0);
  const auto by_module = completed_by_module(params);
  for (std::size_t m = 0; m < by_module.size(); ++m)
    for (ParamId id : by_module[m])
      done_by[static_cast<std::size_t>(id)] = static_cast<ModuleId>(m);
  std::vector<BucketRange> buckets;
  const std::size_t n = layout.param_count();
  bucket_of.assign(n, 0);
  std::uint64_t end = layout.total();
  std::uint64_t limit = std::max<std::uint64_t>(1, first_elements);
  int count = 0;
  for (std::size_t i = n; i-- > 0;) {
    bucket_of[i] = static_cast<int>(buckets.size());
    ++count;
    const std::uint64_t begin = layout.offset(static_cast<ParamId>(i));
    if (i == 0 || end - begin >= limit || done_by[i - 1] != done_by[i]) {
      buckets.push_back({i == 0 ? 0 : begin, end, count});
      end = begin;
      count = 0;
      limit = std::max<std::uint64_t>(1, bucket_elements);
    }
  }
  return buckets;
}

std::vector<std::vector<ParamId>> completed_by_module(const std::vector<ParamSpec>& params) {
  int modules = 1;
  for (const auto& p : params)
    for (auto m : p.used_by) modules = std::max(modules, m + 1);
  std::vector<std::vector<ParamId>> out(static_cast<std::size_t>(modules));
  // A parameter nobody uses counts as complete with the first module, so
  // its bucket is not held back forever.
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& used = params[i].used_by;
    const ModuleId last = used.empty() ? 0 : *std::min_element(used.begin(), used.end());
    out[static_cast<std::size_t>(last)].push_back(static_cast<ParamId>(i));
  }
  return out;
}

}  // namespace ztrain::shard
