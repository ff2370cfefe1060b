// Megatron's sequence parallelism (Korthikanti et al. 2022): between the
// tensor-parallel regions (the attention's q, k, v ... o and the MLP) the
// residual stream, the norms and the embedding's output are split by
// tokens over the tensor group, NL = N / tensor rows a rank, so their
// activations divide by tensor too. Where Megatron-style tensor
// parallelism all-reduces a region's output, the region's partial sums
// are reduce-scattered into each rank's rows instead; where a region reads
// a norm's output, the rows are all-gathered (g and g-bar of the paper).
// Backward mirrors it: an input gradient the group's parts each hold a
// share of is reduce-scattered, a gradient the region reads whole is
// gathered, and the norms' inputs are gathered again rather than kept
// whole (Megatron's choice too: an all-gather of (N, C) against keeping
// (N, C) a norm). A norm's weight gradient sums over this rank's rows
// only, so it is summed over the group before it lands. Without the
// split every helper is what tensor parallelism alone does: all rows on
// every rank, partial sums all-reduced in place.
#include "transformer.h"

namespace ztrain::transformer {

const float* Transformer::all_rows(StepContext& ctx, const Acts& a, const float* own) const {
  if (!cfg_.tensor_sequence) return own;
  const Dims d = dims(a.B, a.T);
  tensor_comm(ctx).all_gather(own, a.gathered, d.own_floats(), DType::f32);
  return a.gathered;
}

float* Transformer::partial_rows(const Acts& a, float* own) const {
  return cfg_.tensor_sequence ? a.gathered : own;
}

void Transformer::sum_rows(StepContext& ctx, const Acts& a, float* partial, float* own) const {
  const Dims d = dims(a.B, a.T);
  if (!cfg_.tensor_sequence) return tensor_sum(ctx, own, d.N * d.C);
  tensor_comm(ctx).reduce_scatter(partial, own, d.own_floats(), DType::f32, ReduceOp::sum);
}

const float* Transformer::own_sum(StepContext& ctx, const Acts& a, float* partial) const {
  float* own = cfg_.tensor_sequence ? a.d_own : partial;
  sum_rows(ctx, a, partial, own);
  return own;
}

void Transformer::norm_backward(StepContext& ctx, const Acts& a, const NormGrad& n) const {
  const Kernels& k = ctx.kernels();
  const Dims d = dims(a.B, a.T);
  const ConstTypedPtr w = param(ctx, *n.w);
  TypedPtr dw(grad(ctx, *n.w)), db = n.b ? TypedPtr(grad(ctx, *n.b)) : TypedPtr{};
  const TypedPtr whole_dw = dw, whole_db = db;
  if (cfg_.tensor_sequence) {  // this rank's rows' share, into fp32 scratch
    ctx.activations().device().fill_zero(a.norm_dw, 2 * d.C * sizeof(float));
    if (dw) dw = TypedPtr(a.norm_dw);
    if (db) db = TypedPtr(a.norm_dw + d.C);
  }
  if (!cfg_.llama)
    k.layernorm_backward(n.dinp, dw, db, n.dout, n.x, w, n.mean, n.rstd, d.own(d.C));
  else
    k.rmsnorm_backward(n.dinp, dw, n.dout, n.x, w, n.rstd, d.own(d.C));
  if (!cfg_.tensor_sequence || !whole_dw) return;
  tensor_comm(ctx).all_reduce(a.norm_dw, (n.b ? 2 : 1) * d.C, DType::f32, ReduceOp::sum);
  add_to_grad(ctx, a, whole_dw, a.norm_dw, d.C);
  if (whole_db) add_to_grad(ctx, a, whole_db, a.norm_dw + d.C, d.C);
}

void Transformer::add_to_grad(StepContext& ctx, const Acts& a, TypedPtr grad, const float* src,
                              std::size_t n) const {
  Device& device = ctx.activations().device();
  if (grad.dtype == DType::f32) return device.accumulate(grad, ConstTypedPtr(src), n);
  device.convert(TypedPtr(a.norm_tmp), grad, n);
  ctx.kernels().add(a.norm_tmp, a.norm_tmp, src, n);
  device.convert(grad, ConstTypedPtr(a.norm_tmp), n);
}

}  // namespace ztrain::transformer
