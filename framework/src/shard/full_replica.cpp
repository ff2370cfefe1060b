#include "ztrain/shard/full_replica.h"

#include <algorithm>

#include "ztrain/shard/init.h"

namespace ztrain::shard {

FullReplica::FullReplica(Device& device, const std::vector<ParamSpec>& params,
                         const FlatLayout& layout, std::uint64_t seed)
    : params_(params),
      layout_(layout),
      weights_(device.allocate(Tier::device, Category::params, layout.total() * sizeof(float))),
      grads_(device.allocate(Tier::device, Category::grads, layout.total() * sizeof(float))) {
  init_flat(params_, layout_, seed, 0, layout_.total(), weights_.as<float>());
}

TensorView FullReplica::view(const Buffer& b, ParamId p) const {
  return {b.as<float>() + layout_.offset(p), DType::f32,
          params_[static_cast<std::size_t>(p)].shape};
}

void FullReplica::read(ParamId p, float* out) const {
  const float* src = weights_.as<float>() + layout_.offset(p);
  std::copy(src, src + layout_.numel(p), out);
}

void FullReplica::write(ParamId p, const float* in) {
  std::copy(in, in + layout_.numel(p), weights_.as<float>() + layout_.offset(p));
}

}  // namespace ztrain::shard
