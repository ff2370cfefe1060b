// FullReplica: every parameter (and, unless declined, every gradient) held
// whole on this rank in flat buffers indexed by a FlatLayout, parameters in
// the working precision and gradients in their own type: the
// storage of ddp, zero1 and (parameters only) zero2. The parameters start
// from the seed (init_flat), so every rank holds the same values without
// communicating (no seed: zeros, for a caller that loads them next); after a sharded optimizer
// step, publish() gathers each rank's owned range back into every replica.
//
// Ownership: owns its buffers (device tier, categories params and grads);
// keeps references to `params` and `layout`, which must outlive it.
// Thread safety: the training thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/kernels.h"
#include "ztrain/model.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/tensor.h"

namespace ztrain::shard {

class ZTRAIN_API FullReplica {
 public:
  // grad_type: nullopt holds no gradients.
  FullReplica(Device& device, const ParamSpecs& params, const FlatLayout& layout,
              std::optional<std::uint64_t> seed, DType param_type, std::optional<DType> grad_type);
  // All-gathers every rank's owned range of the parameters into every
  // replica, in pieces of at most bucket_elements (collective).
  void publish(Communicator& comm, std::uint64_t bucket_elements);

  TensorView param(ParamId p) const { return view(weights_, param_type_, p); }
  TensorView grad(ParamId p) const { return view(grads_, grad_type_, p); }
  // fp32 values of the working copy (export).
  void read(ParamId p, float* out) const;
  TypedPtr weights() const { return {weights_.data(), param_type_}; }
  TypedPtr grads() const { return {grads_.data(), grad_type_}; }

 private:
  TensorView view(const Buffer& b, DType t, ParamId p) const;
  Device& device_;
  const ParamSpecs& params_;
  const FlatLayout& layout_;
  DType param_type_, grad_type_;
  Buffer weights_, grads_;
};

}  // namespace ztrain::shard
