#include "ztrain/shard/owned_shard.h"

#include <cstring>
#include <string>

#include "ztrain/error.h"

namespace ztrain::shard {

OwnedShard::~OwnedShard() = default;

void OwnedShard::check(std::uint64_t b, std::uint64_t e) const {
  if (b > e || b < begin_ || e > end_)
    throw InternalError("owned shard [" + std::to_string(begin_) + ", " + std::to_string(end_) +
                        "): elements [" + std::to_string(b) + ", " + std::to_string(e) +
                        ") asked for are outside it");
}

ShardLoan ResidentShard::lend(std::uint64_t b, std::uint64_t e) {
  check(b, e);
  return {Buffer(), data_.at(b - begin())};
}

void ResidentShard::write(std::uint64_t b, ConstTypedPtr src, std::uint64_t n) {
  check(b, b + n);
  device_.copy(data_.at(b - begin()).data, src.data, n * dtype_size(dtype()));
}

}  // namespace ztrain::shard
