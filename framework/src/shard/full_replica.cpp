#include "ztrain/shard/full_replica.h"

#include <algorithm>

#include "ztrain/shard/init.h"

namespace ztrain::shard {

FullReplica::FullReplica(Device& device, const std::vector<ParamSpec>& params,
                         const FlatLayout& layout, std::uint64_t seed, bool with_grads)
    : params_(params),
      layout_(layout),
      weights_(device.allocate(Tier::device, Category::params, layout.total() * sizeof(float))),
      grads_(with_grads
                 ? device.allocate(Tier::device, Category::grads, layout.total() * sizeof(float))
                 : Buffer{}) {
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

namespace ztrain::shard {

std::uint64_t FullReplica::publish(Communicator& comm, std::uint64_t bucket_elements) {
  const int rank = comm.rank();
  const std::uint64_t step = std::max<std::uint64_t>(1, bucket_elements);
  float* w = weights_.as<float>();
  std::vector<CommWork> works;
  std::uint64_t sent = 0;
  for (std::uint64_t b = 0; b < layout_.total(); b += step) {
    const std::uint64_t e = std::min(layout_.total(), b + step);
    const auto counts = layout_.owned_counts(b, e);
    const std::uint64_t mine = counts[static_cast<std::size_t>(rank)];
    // In place: this rank's part already sits where the result puts it
    // (after the parts of the ranks before it).
    std::uint64_t before = 0;
    for (int r = 0; r < rank; ++r) before += counts[static_cast<std::size_t>(r)];
    const float* send = w + b + before;
    works.push_back(comm.all_gather_v_async(send, w + b, counts, DType::f32));
    sent += mine * static_cast<std::uint64_t>(comm.size() - 1) * sizeof(float);
  }
  wait_all(works);
  return sent;
}

}  // namespace ztrain::shard
