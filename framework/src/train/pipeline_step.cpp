#include "train/pipeline_step.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "train/run_assembly.h"
#include "ztrain/error.h"
#include "ztrain/pipeline/stage_partition.h"

namespace ztrain {
namespace {

using pipeline::Action;
using pipeline::ActionKind;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// FNV-1a over the values that must be equal on every stage.
struct Fingerprint {
  std::uint64_t h = 14695981039346656037ull;
  void add(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
};

}  // namespace

HeldBatch::HeldBatch(const Batch& batch) : shape_(batch.shape) {
  const std::size_t n = static_cast<std::size_t>(shape_.batch) * shape_.seq_len;
  inputs_.assign(batch.inputs, batch.inputs + n);
  targets_.assign(batch.targets, batch.targets + n);
  if (batch.positions) positions_.assign(batch.positions, batch.positions + n);
}

Batch HeldBatch::batch() const {
  return {shape_, inputs_.data(), targets_.data(),
          positions_.empty() ? nullptr : positions_.data()};
}

std::uint64_t stage_activations(const pipeline::SchedulePlan& plan, std::size_t stage,
                                const StageBytes& bytes) {
  const pipeline::ScheduleShape& shape = plan.shape;
  const auto vs = [&](const Action& a) { return a.chunk * shape.stages + stage; };
  const auto first = [&](const Action& a) { return vs(a) == 0; };
  const auto last = [&](const Action& a) { return vs(a) + 1 == shape.virtual_stages(); };
  std::uint64_t buffers = 0, arenas = 0, most = 0;
  const auto held = [&] { return bytes.working + arenas * bytes.kept + buffers * bytes.buffer; };
  for (const Action& a : plan.stages.at(stage)) {
    switch (a.kind) {
      case ActionKind::recv_activation:
      case ActionKind::recv_gradient:
        ++buffers;
        break;
      case ActionKind::forward:
        ++arenas;
        buffers += last(a) ? 0 : 1;
        break;
      case ActionKind::backward:
      case ActionKind::backward_input:
        buffers += first(a) ? 0 : 1;  // the input's gradient, kept to the end
        most = std::max(most, held());
        // The chunk's arena, its input, its output and the output's
        // gradient are freed.
        --arenas;
        buffers -= (first(a) ? 0 : 1) + (last(a) ? 0 : 2);
        break;
      case ActionKind::backward_weight:
      case ActionKind::send_activation:
      case ActionKind::send_gradient:
        break;
    }
    most = std::max(most, held());
  }
  return most;
}

PipelineStepSetup pipeline_setup(const Run& run, const ParamSpecs& params) {
  const ParallelSettings& par = run.settings.parallel;
  const auto P = static_cast<std::size_t>(par.pipeline);
  Communicator& group = *run.group_of(MeshDim::pipeline);
  const auto stage = static_cast<std::size_t>(group.rank());
  PipelineStepSetup s{*run.model,
                      *run.device,
                      group,
                      run.pipeline_plan,
                      pipeline::stage_chunks(run.pipeline_bounds, P, stage),
                      run.model->modules().size(),
                      {},
                      {},
                      {}};
  const int shards = par.split().shards();
  s.micro = {static_cast<int>(run.settings.train.micro_batch), run.model->info().seq_len / shards,
             par.split(), run.settings.train.activation_dtype};
  for (std::size_t i = 0; i < run.whole_params.size(); ++i) {
    const ParamSpec& whole = run.whole_params[id_at<ParamId>(i)];
    const std::vector<std::size_t> holders =
        pipeline::stages_holding(whole, run.pipeline_bounds, P);
    if (holders.size() < 2) continue;
    auto set = std::find(s.tied_sets.begin(), s.tied_sets.end(), holders);
    if (set == s.tied_sets.end()) set = s.tied_sets.insert(set, holders);
    if (std::find(holders.begin(), holders.end(), stage) == holders.end()) continue;
    const auto mine = std::find_if(params.begin(), params.end(), [&](const ParamSpec& p) {
      return p.model_id && index_of(*p.model_id) == i;
    });
    const auto here = std::find_if(whole.used_by.begin(), whole.used_by.end(), [&](ModuleId m) {
      return std::any_of(s.chunks.begin(), s.chunks.end(),
                         [&](const ModuleRange& r) { return r.contains(m); });
    });
    if (mine == params.end() || here == whole.used_by.end())
      throw InternalError("the stage does not hold '" + whole.name + "', which its modules use");
    s.tied.push_back({id_at<ParamId>(static_cast<std::size_t>(mine - params.begin())), *here,
                      static_cast<std::size_t>(set - s.tied_sets.begin())});
  }
  return s;
}

PipelineStep::PipelineStep(PipelineStepSetup setup)
    : setup_(std::move(setup)),
      floats_(setup_.model.stage_floats(setup_.micro)),
      working_(setup_.device),
      links_(setup_.pipeline, setup_.plan.shape.chunks > 1, setup_.tied_sets) {
  const pipeline::ScheduleShape& shape = setup_.plan.shape;
  if (shape.stages != static_cast<std::size_t>(setup_.pipeline.size()) ||
      shape.chunks != setup_.chunks.size())
    throw InternalError("a pipeline plan of " + std::to_string(shape.stages) + " stages x " +
                        std::to_string(shape.chunks) + " chunks for a stage of " +
                        std::to_string(setup_.chunks.size()) + " chunks in a group of " +
                        std::to_string(setup_.pipeline.size()));
  agree();
}

// What every stage must hold alike, as one fingerprint.
void PipelineStep::agree() const {
  Fingerprint f;
  const pipeline::SchedulePlan& plan = setup_.plan;
  for (const std::size_t v :
       {plan.shape.stages, plan.shape.micro_batches, plan.shape.chunks, setup_.modules, floats_})
    f.add(v);
  for (const auto& stage : plan.stages)
    for (const Action& a : stage)
      f.add(static_cast<std::uint64_t>(a.kind) << 56 ^ a.micro_batch << 16 ^ a.chunk);
  f.add(static_cast<std::uint64_t>(setup_.micro.batch) << 32 ^
        static_cast<std::uint64_t>(setup_.micro.seq_len));
  check_stages_agree(setup_.pipeline, f.h,
                     "the step's plan, the model's modules or the micro-batch shape");
}

std::size_t PipelineStep::virtual_stage(std::size_t chunk) const {
  return chunk * setup_.plan.shape.stages + stage();
}

bool PipelineStep::last_virtual(std::size_t chunk) const {
  return virtual_stage(chunk) + 1 == setup_.plan.shape.virtual_stages();
}

double PipelineStep::loss_weight() const {
  return last_virtual(setup_.chunks.size() - 1) ? static_cast<double>(setup_.plan.shape.stages)
                                                : 0.0;
}

PipelineStep::Slot& PipelineStep::slot(const Action& a) {
  return slots_.at(a.micro_batch * setup_.plan.shape.chunks + a.chunk);
}

Buffer PipelineStep::activation() {
  return setup_.device.allocate(Tier::device, Category::activations, floats_ * sizeof(float),
                                Fill::undefined);
}

StageRun PipelineStep::stage_run(const Action& a) {
  Slot& s = slot(a);
  StageRun r;
  r.modules = setup_.chunks.at(a.chunk);
  r.input = first_virtual(a.chunk) ? nullptr : s.input.as<float>();
  return r;
}

// Forward and backward; the chunk's buffers and activations are the
// slot's.
void PipelineStep::compute(const Action& a, const Batch& batch, const StageContextParts& parts,
                           float token_scale) {
  Slot& s = slot(a);
  StageRun r = stage_run(a);
  if (a.kind == ActionKind::forward) {
    if (!last_virtual(a.chunk)) {
      s.output = activation();
      r.output = s.output.as<float>();
    }
    s.activations = std::make_unique<Arena>(setup_.device, &working_);
    StepContext ctx = parts.context_for(token_scale, *s.activations);
    return setup_.model.stage_forward(batch, r, ctx);
  }
  if (!s.activations)
    throw InternalError("the backward of micro-batch " + std::to_string(a.micro_batch) +
                        ", chunk " + std::to_string(a.chunk) + " before its forward");
  StepContext ctx = parts.context_for(token_scale, *s.activations);
  if (!last_virtual(a.chunk)) r.output_grad = s.output_grad.as<float>();
  if (!first_virtual(a.chunk)) {
    s.input_grad = activation();
    r.input_grad = s.input_grad.as<float>();
  }
  setup_.model.stage_backward(batch, r, ctx);
  // Its activation has reached the next stage (that stage's gradient came
  // back): the output and what backward read are free.
  s.output_sent.wait();
  s.output = Buffer{};
  s.input = Buffer{};
  s.output_grad = Buffer{};
  s.activations.reset();
}

void PipelineStep::run(const Action& a, const std::vector<Batch>& batches,
                       const StageContextParts& parts, float token_scale) {
  Slot& s = slot(a);
  const auto t0 = Clock::now();
  switch (a.kind) {
    case ActionKind::recv_activation:
      s.input = activation();
      links_.recv_activation(s.input.as<float>(), floats_);
      return;
    case ActionKind::recv_gradient:
      s.output_grad = activation();
      links_.recv_gradient(s.output_grad.as<float>(), floats_);
      return;
    case ActionKind::send_activation:
      s.output_sent = links_.send_activation(s.output.as<float>(), floats_);
      return;
    case ActionKind::send_gradient:
      sends_.push_back(links_.send_gradient(s.input_grad.as<float>(), floats_));
      return;
    case ActionKind::backward_weight:
      return;  // backward_input ran the whole backward
    case ActionKind::forward:
    case ActionKind::backward:
    case ActionKind::backward_input:
      break;
  }
  if (a.kind != ActionKind::forward) parts.strategy.begin_micro_step(false);
  compute(a, batches.at(a.micro_batch), parts, token_scale);
  time_.compute_s += seconds_since(t0);
}

void PipelineStep::train(const std::vector<Batch>& batches, const StageContextParts& parts,
                         float token_scale) {
  const pipeline::ScheduleShape& shape = setup_.plan.shape;
  if (batches.size() != shape.micro_batches)
    throw InternalError("a pipeline step of " + std::to_string(shape.micro_batches) +
                        " micro-batches given " + std::to_string(batches.size()));
  time_ = {};
  slots_.clear();
  slots_.resize(shape.micro_batches * shape.chunks);
  sends_.clear();
  const auto t0 = Clock::now();
  for (const Action& a : setup_.plan.stages.at(stage())) run(a, batches, parts, token_scale);
  time_.span_s = seconds_since(t0);
  finish_gradients(parts, token_scale);
  wait_all(sends_);
  slots_.clear();
}

// The tied sums come first, each inside a module of this stage that uses
// the parameter (where the gradient may be touched), in the order of the
// tied list, which every stage holds alike; then the hooks of every
// module, last to first, as one backward that computes nothing.
void PipelineStep::finish_gradients(const StageContextParts& parts, float token_scale) {
  StepContext ctx = parts.context_for(token_scale);
  parts.strategy.begin_micro_step(false);  // the sums touch gradients in a micro-step of their own
  for (const TiedParam& t : setup_.tied) {
    ctx.enter_backward(t.where);
    const TensorView g = ctx.grad(t.param);
    if (g.data)
      links_.tied(t.set)->all_reduce(g.data, static_cast<std::size_t>(g.numel()), g.dtype,
                                     ReduceOp::sum);
    ctx.exit_backward(t.where);
  }
  parts.strategy.begin_micro_step(true);
  for (std::size_t m = setup_.modules; m-- > 0;) {
    ctx.enter_backward(id_at<ModuleId>(m));
    ctx.exit_backward(id_at<ModuleId>(m));
  }
}

std::vector<double> PipelineStep::idle_shares() const {
  const float mine[2] = {static_cast<float>(time_.compute_s), static_cast<float>(time_.span_s)};
  std::vector<float> all(2 * static_cast<std::size_t>(setup_.pipeline.size()));
  setup_.pipeline.all_gather(mine, all.data(), 2, DType::f32);
  double schedule = 0;
  for (std::size_t s = 0; s < all.size(); s += 2) schedule = std::max<double>(schedule, all[s + 1]);
  std::vector<double> shares;
  for (std::size_t s = 0; s < all.size(); s += 2)
    shares.push_back(schedule > 0 ? std::max(0.0, 1.0 - all[s] / schedule) : 0.0);
  return shares;
}

void PipelineStep::evaluate(const Batch& batch, const StageContextParts& parts) {
  std::vector<CommWork> sends;
  std::vector<Buffer> held;
  for (std::size_t c = 0; c < setup_.chunks.size(); ++c) {
    StageRun r;
    r.modules = setup_.chunks[c];
    r.evaluate = true;
    if (!first_virtual(c)) {
      held.push_back(activation());
      links_.recv_activation(held.back().as<float>(), floats_);
      r.input = held.back().as<float>();
    }
    if (!last_virtual(c)) {
      held.push_back(activation());
      r.output = held.back().as<float>();
    }
    Arena activations(setup_.device, &working_);
    StepContext ctx = parts.context_for(1.0f, activations);
    setup_.model.stage_forward(batch, r, ctx);
    if (r.output) sends.push_back(links_.send_activation(r.output, floats_));
  }
  wait_all(sends);
}

}  // namespace ztrain
