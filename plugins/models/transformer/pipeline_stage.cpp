// The transformer as a pipeline stage: the parameters its chunks use, and
// a chunk's forward and backward on one micro-batch.
//
// A chunk's forward leaves its activations in the arena the host keeps
// for that micro-batch, and its backward rewinds the arena and reads them
// there, as one micro-step's backward reads its forward's: nothing is
// computed twice, so each stage's share of a step is its share of the
// model's work, which is what the schedules' idle-time formulas assume.
// What plan() takes as working memory (the gradients, the head's chunk of
// logits) the micro-batches a stage holds share. The chunk holding the
// head runs its blocks forward and leaves the head to its backward, which
// computes the loss and its gradient from the logits at once (the fused
// chunked head of one micro-step). With [model] activation_checkpointing
// a chunk keeps each block's input only and its backward recomputes each
// block, as a whole model's does.
//
// Modules: 0 is the embedding, 1..L the blocks, L + 1 the head; the
// streams and the blocks' activations of a chunk are indexed from its
// first block (Acts::first_block), so a chunk's buffers are laid out for
// the largest chunk of the stage, not for the whole model.
#include <algorithm>
#include <string>

#include "transformer.h"
#include "ztrain/error.h"

namespace ztrain::transformer {

ParamId Transformer::stage_id(ParamId p) const {
  if (stage_chunks_.empty()) return p;
  const std::optional<ParamId>& id = stage_ids_.at(index_of(p));
  if (!id)
    throw InternalError("the transformer's stage touched '" + params_[p].name +
                        "', a parameter of another pipeline stage");
  return *id;
}

Transformer::BlockSpan Transformer::blocks_of(ModuleRange r) const {
  const auto L = static_cast<std::size_t>(cfg_.n_layer);
  const std::size_t first = std::max<std::size_t>(r.first, 1) - 1;
  const std::size_t end = std::min(r.end, L + 1);
  return {static_cast<int>(first), static_cast<int>(std::max(end, first + 1) - 1)};
}

int Transformer::planned_blocks() const {
  if (stage_chunks_.empty()) return cfg_.n_layer;
  int most = 1;  // a chunk of the embedding or the head alone still lays out one
  for (const ModuleRange& r : stage_chunks_) {
    const BlockSpan s = blocks_of(r);
    most = std::max(most, s.end - s.first);
  }
  return most;
}

// A parameter belongs to the stage when one of its modules is in a chunk;
// a tied one whose first module is another stage's is that stage's copy.
std::string Transformer::split_stages(const std::vector<ModuleRange>& chunks) {
  const auto modules = static_cast<std::size_t>(cfg_.n_layer) + 2;
  if (chunks.empty()) return "a pipeline stage with no chunk of modules runs nothing";
  for (const ModuleRange& r : chunks)
    if (r.first >= r.end || r.end > modules)
      return "modules [" + std::to_string(r.first) + ", " + std::to_string(r.end) +
             ") are no chunk of the transformer's " + std::to_string(modules) + " modules";
  if (cfg_.offload_checkpoints)
    return "[model] offload_checkpoints moves every block's input to host memory and back "
           "within one micro-step, and a pipeline stage holds several micro-batches between "
           "their forward and backward; set offload_checkpoints = false "
           "(activation_checkpointing = true keeps only each block's input on the device)";
  const auto on_stage = [&](ModuleId m) {
    return std::any_of(chunks.begin(), chunks.end(),
                       [&](const ModuleRange& r) { return r.contains(m); });
  };
  stage_chunks_ = chunks;
  stage_params_ = ParamSpecs{};
  stage_ids_.assign(params_.size(), std::nullopt);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamSpec& whole = params_[id_at<ParamId>(i)];
    if (std::none_of(whole.used_by.begin(), whole.used_by.end(), on_stage)) continue;
    ParamSpec spec = whole;
    spec.model_id = id_at<ParamId>(i);
    spec.tied_copy = !on_stage(*std::min_element(whole.used_by.begin(), whole.used_by.end()));
    stage_ids_[i] = stage_params_.push_back(std::move(spec));
  }
  return {};
}

std::uint64_t Transformer::stage_floats(const BatchShape& shape) const {
  return dims(shape.batch, shape.seq_len).own_floats();
}

Transformer::Acts Transformer::stage_planned(const Batch& batch, const StageRun& run,
                                             StepContext& ctx, bool rewound) const {
  Acts a = planned(batch, ctx, {.rewound = rewound});
  const BlockSpan span = blocks_of(run.modules);
  a.first_block = span.first;
  if (rewound) return a;
  const std::size_t NC = dims(a.B, a.T).own_floats();
  if (run.modules.first == 0) {
    ctx.enter_forward(kEmbed);
    embed_forward(ctx, a);
    keep(ctx, a, stream(a, 0), NC, stream_kept(a, 0));
    ctx.exit_forward(kEmbed);
    return a;
  }
  float* x = stream(a, span.first);
  ctx.activations().device().copy(x, run.input, NC * sizeof(float));
  keep(ctx, a, x, NC, stream_kept(a, span.first));  // rounded already: only kept
  return a;
}

void Transformer::blocks_forward(StepContext& ctx, Acts& a, BlockSpan span) const {
  const std::size_t NC = dims(a.B, a.T).own_floats();
  for (int l = span.first; l < span.end; ++l) {
    ctx.enter_forward(block_module(l));
    block_forward(l, stream(a, l), stream(a, l + 1), block_acts(a, l), a, ctx);
    keep(ctx, a, stream(a, l + 1), NC, stream_kept(a, l + 1));
    ctx.exit_forward(block_module(l));
  }
}

void Transformer::stage_forward(const Batch& batch, const StageRun& run, StepContext& ctx) {
  Acts a = stage_planned(batch, run, ctx, false);
  const BlockSpan span = blocks_of(run.modules);
  blocks_forward(ctx, a, span);
  if (run.evaluate && !run.output) return head_forward(ctx, a);
  if (!run.output) return;  // the head's chunk: the head runs in its backward
  ctx.activations().device().copy(run.output, stream(a, span.end),
                                  dims(a.B, a.T).own_floats() * sizeof(float));
}

void Transformer::stage_backward(const Batch& batch, const StageRun& run, StepContext& ctx) {
  Acts a = stage_planned(batch, run, ctx, true);
  const BlockSpan span = blocks_of(run.modules);
  const std::size_t NC = dims(a.B, a.T).own_floats();
  Device& device = ctx.activations().device();
  if (run.modules.end == static_cast<std::size_t>(cfg_.n_layer) + 2)
    head_forward_backward(ctx, a);
  else
    device.copy(a.d_res, run.output_grad, NC * sizeof(float));
  for (int l = span.end - 1; l >= span.first; --l) {
    restore(ctx, a, stream(a, l), NC, stream_kept(a, l));
    ctx.enter_backward(block_module(l));
    block_backward(l, a, ctx);
    ctx.exit_backward(block_module(l));
  }
  if (run.modules.first > 0) return device.copy(run.input_grad, a.d_res, NC * sizeof(float));
  ctx.enter_backward(kEmbed);
  embed_backward(ctx, a);
  ctx.exit_backward(kEmbed);
}

}  // namespace ztrain::transformer
