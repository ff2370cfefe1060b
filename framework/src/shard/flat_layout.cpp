#include "ztrain/shard/flat_layout.h"

#include <algorithm>

#include "ztrain/error.h"

namespace ztrain::shard {

FlatLayout::FlatLayout(const ParamSpecs& params, int world, std::uint64_t align) : world_(world) {
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
  for (ParamId p : params()) {
    const std::uint64_t b = std::max(begin, offsets_[p]);
    const std::uint64_t e = std::min(end, offsets_[p] + numels_[p]);
    if (b < e) out.push_back({p, b, e});
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

IdVector<BucketId, BucketRange> reverse_buckets(const FlatLayout& layout, const ParamSpecs& params,
                                                std::uint64_t bucket_elements,
                                                std::uint64_t first_elements,
                                                IdVector<ParamId, BucketId>& bucket_of) {
  // The module whose backward completes each parameter's gradient.
  IdVector<ParamId, ModuleId> done_by(params.size(), ModuleId{});
  const auto by_module = completed_by_module(params);
  for (ModuleId m : by_module.ids())
    for (ParamId id : by_module[m]) done_by[id] = m;
  IdVector<BucketId, BucketRange> buckets;
  bucket_of = IdVector<ParamId, BucketId>(layout.param_count(), BucketId{});
  std::uint64_t end = layout.total();
  std::uint64_t limit = std::max<std::uint64_t>(1, first_elements);
  int count = 0;
  const ParamId first{};
  for (std::size_t i = layout.param_count(); i-- > 0;) {
    const auto p = id_at<ParamId>(i);
    bucket_of[p] = buckets.end_id();
    ++count;
    const std::uint64_t begin = layout.offset(p);
    if (p == first || end - begin >= limit || done_by[id_at<ParamId>(i - 1)] != done_by[p]) {
      buckets.push_back({p == first ? 0 : begin, end, count});
      end = begin;
      count = 0;
      limit = std::max<std::uint64_t>(1, bucket_elements);
    }
  }
  return buckets;
}

IdVector<ModuleId, std::vector<ParamId>> completed_by_module(const ParamSpecs& params) {
  std::size_t modules = 1;
  for (const auto& p : params)
    for (ModuleId m : p.used_by) modules = std::max(modules, index_of(m) + 1);
  IdVector<ModuleId, std::vector<ParamId>> out(modules);
  // A parameter nobody uses counts as complete with the first module, so
  // its bucket is not held back forever.
  for (ParamId p : params.ids()) {
    const auto& used = params[p].used_by;
    const ModuleId last = used.empty() ? ModuleId{} : *std::min_element(used.begin(), used.end());
    out[last].push_back(p);
  }
  return out;
}

}  // namespace ztrain::shard
