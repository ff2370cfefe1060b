#include "ztrain/shard/full_replica.h"

#include <algorithm>

#include "ztrain/shard/init.h"

namespace ztrain::shard {

FullReplica::FullReplica(Device& device, const ParamSpecs& params, const FlatLayout& layout,
                         std::optional<std::uint64_t> seed, DType param_type,
                         std::optional<DType> grad_type)
    : device_(device),
      params_(params),
      layout_(layout),
      param_type_(param_type),
      grad_type_(grad_type.value_or(DType::f32)),
      weights_(
          device.allocate(Tier::device, Category::params, layout.total() * dtype_size(param_type))),
      grads_(grad_type ? device.allocate(Tier::device, Category::grads,
                                         layout.total() * dtype_size(*grad_type))
                       : Buffer{}) {
  if (seed) init_flat(params_, layout_, *seed, 0, layout_.total(), weights(), device, Tier::device);
}

TensorView FullReplica::view(const Buffer& b, DType t, ParamId p) const {
  return {TypedPtr(b.data(), t).at(layout_.offset(p)).data, t, params_[p].shape};
}

void FullReplica::read(ParamId p, float* out) const {
  device_.convert(out, weights().at(layout_.offset(p)), layout_.numel(p));
}

}  // namespace ztrain::shard

namespace ztrain::shard {

void FullReplica::publish(Communicator& comm, std::uint64_t bucket_elements) {
  const int rank = comm.rank();
  const std::uint64_t step = std::max<std::uint64_t>(1, bucket_elements);
  const TypedPtr w = weights();
  std::vector<CommWork> works;
  for (std::uint64_t b = 0; b < layout_.total(); b += step) {
    const std::uint64_t e = std::min(layout_.total(), b + step);
    const auto counts = layout_.owned_counts(b, e);
    // In place: this rank's part already sits where the result puts it
    // (after the parts of the ranks before it).
    std::uint64_t before = 0;
    for (int r = 0; r < rank; ++r) before += counts[static_cast<std::size_t>(r)];
    works.push_back(comm.all_gather_v_async(w.at(b + before).data, w.at(b).data, counts, w.dtype));
  }
  wait_all(works);
}

}  // namespace ztrain::shard
