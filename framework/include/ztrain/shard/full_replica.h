// FullReplica: every parameter and gradient held whole on this rank, in two
// flat fp32 buffers indexed by a FlatLayout (the storage of ddp and zero1).
// The parameters start from the seed (init_flat), so every rank holds the
// same values without communicating.
//
// Ownership: owns both buffers (device tier, categories params and grads);
// keeps references to `params` and `layout`, which must outlive it.
// Thread safety: the training thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/model.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/tensor.h"

namespace ztrain::shard {

class ZTRAIN_API FullReplica {
 public:
  FullReplica(Device& device, const std::vector<ParamSpec>& params, const FlatLayout& layout,
              std::uint64_t seed);

  TensorView param(ParamId p) const { return view(weights_, p); }
  TensorView grad(ParamId p) const { return view(grads_, p); }
  void read(ParamId p, float* out) const;
  void write(ParamId p, const float* in);
  float* weights() const { return weights_.as<float>(); }
  float* grads() const { return grads_.as<float>(); }

 private:
  TensorView view(const Buffer& b, ParamId p) const;
  const std::vector<ParamSpec>& params_;
  const FlatLayout& layout_;
  Buffer weights_, grads_;
};

}  // namespace ztrain::shard
