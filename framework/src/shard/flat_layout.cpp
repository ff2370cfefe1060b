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
