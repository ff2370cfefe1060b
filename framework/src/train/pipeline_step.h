// A pipeline stage's step: the executor of a checked schedule plan
// (ztrain/pipeline/schedule.h) over the model's stage (Model::
// stage_forward, stage_backward) and the links to the neighbouring stages
// (job/stage_links.h).
//
// A training step runs the stage's actions in the plan's order: a forward
// leaves its chunk's activations in an arena of that (micro-batch, chunk)'s
// own, which its backward rewinds and reads (Model::stage_backward) and then
// frees; the working memory of every action is one arena the held ones share.
// The chunk's input (received) is kept to its backward too; sends are issued
// without waiting; receives wait. An output is freed after its micro-batch's
// backward (the gradient that came back means its send is done), an input's
// gradient at the step's end (stage_activations counts what a stage holds at
// once). Every action is an accumulating micro-step of the strategy (each
// backward its own, modules last to first); then each tied parameter's
// gradient is summed over the stages holding it (an embedding and the head
// tied to it: the sum both would have in one model), and one last micro-step
// of hooks alone, every module of the model backward in reverse with nothing
// computed, lets the strategy reduce the whole gradients over the data group
// (ddp, zero1: Strategy::pipeline_refusal). A split backward (backward_input,
// then backward_weight: a zero-bubble schedule's) runs whole at
// backward_input and backward_weight has nothing left; the gradients are the
// same, the split's idle-time saving is not had.
//
// Evaluation runs each micro-batch forward through the virtual stages in
// order, the last reporting the losses; its arena is freed when it ends.
//
// The loss: only the stage holding the head reports losses; the trainer
// averages a step's loss over every rank, so that stage's are weighed by
// the stage count (loss_weight) and the others report none.
//
// Before the first step the stages compare a fingerprint of their plan,
// chunks and micro-batch shape over the pipeline group: one that differs
// ends the job naming both stages.
//
// Ownership: holds references to the model, the device and the pipeline
// group, which outlive it. Thread safety: one thread. Errors: ConfigError
// for stages that disagree; what the model and the communicators raise.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "job/stage_links.h"
#include "ztrain/model.h"
#include "ztrain/pipeline/schedule.h"
#include "ztrain/strategy.h"

namespace ztrain {

// What a micro-step's StepContext is made of (a pipeline action's, or
// the trainer's micro-step and evaluation without a pipeline).
struct StageContextParts {
  Strategy& strategy;
  const ParamSpecs& params;  // the model's (under a pipeline, the stage's)
  const Kernels& kernels;
  Arena& arena;
  LossSum& losses;
  Communicator* sequence = nullptr;
  Communicator* context = nullptr;
  Communicator* tensor = nullptr;
  // The context of one micro-step, with the mesh's groups, its
  // activations in `in` (by default `arena`).
  StepContext context_for(float token_scale) const { return context_for(token_scale, arena); }
  StepContext context_for(float token_scale, Arena& in) const {
    StepContext ctx(strategy, params, kernels, in, losses, token_scale);
    ctx.set_sequence_groups(sequence, context);
    ctx.set_tensor_group(tensor);
    return ctx;
  }
};

// A parameter this stage holds that other stages hold too, and the set of
// stages (StageLinks' tied set) whose gradients are summed.
struct TiedParam {
  ParamId param;   // the stage's id
  ModuleId where;  // a module of this stage that uses it
  std::size_t set;
};

struct PipelineStepSetup {
  Model& model;
  Device& device;
  Communicator& pipeline;           // the stages, ordered by stage
  pipeline::SchedulePlan plan;      // checked (check_schedule) when the run was made
  std::vector<ModuleRange> chunks;  // this stage's
  std::size_t modules = 0;          // the whole model's
  std::vector<TiedParam> tied;
  std::vector<std::vector<std::size_t>> tied_sets;
  BatchShape micro;  // every micro-batch's shape
};

// A step's schedule on this stage: the seconds its forwards and
// backwards took, and from its first action's start to its last one's end.
struct StageTime {
  double compute_s = 0;
  double span_s = 0;
};

// A micro-batch's tokens copied out of the data loader, which reuses its
// buffers: the schedule reads each micro-batch twice, in its own order.
class HeldBatch {
 public:
  explicit HeldBatch(const Batch& batch);
  Batch batch() const;

 private:
  BatchShape shape_;
  std::vector<std::int32_t> inputs_, targets_, positions_;
};

class PipelineStep {
 public:
  // Collective over the pipeline group: the links made, the stages'
  // fingerprints compared.
  explicit PipelineStep(PipelineStepSetup setup);
  // One training step over the M micro-batches (this stage's copies of
  // them, in order), each trained token's loss gradient token_scale.
  void train(const std::vector<Batch>& batches, const StageContextParts& parts, float token_scale);
  // The forward of `batch` through every stage; the last reports its
  // losses.
  void evaluate(const Batch& batch, const StageContextParts& parts);
  // What the losses this stage reports weigh in the average over every
  // rank: the stage count on the stage holding the head, else 0.
  double loss_weight() const;
  // Every stage's share of the last step's schedule (the longest stage's
  // span: the stages start together, and each waits for the last to end)
  // spent not computing: its idle time, (P-1)/(M+P-1) for GPipe and 1F1B
  // with stages that cost alike. In stage order; collective over the
  // pipeline group.
  std::vector<double> idle_shares() const;

 private:
  std::size_t stage() const { return static_cast<std::size_t>(setup_.pipeline.rank()); }
  std::size_t virtual_stage(std::size_t chunk) const;
  bool first_virtual(std::size_t chunk) const { return virtual_stage(chunk) == 0; }
  bool last_virtual(std::size_t chunk) const;
  void agree() const;
  // One (micro-batch, chunk) of the step on this stage: the input held
  // for backward, the output sent and its send, the output's gradient
  // received, the input's gradient sent (kept to the step's end), and the
  // activations forward leaves for backward.
  struct Slot {
    Buffer input, output, output_grad, input_grad;
    CommWork output_sent;
    std::unique_ptr<Arena> activations;
  };
  Slot& slot(const pipeline::Action& a);
  // A chunk's input or output for one micro-batch, of the device's
  // activations.
  Buffer activation();
  StageRun stage_run(const pipeline::Action& a);
  void run(const pipeline::Action& a, const std::vector<Batch>& batches,
           const StageContextParts& parts, float token_scale);
  void compute(const pipeline::Action& a, const Batch& batch, const StageContextParts& parts,
               float token_scale);
  // The tied gradients summed, then the strategy's last micro-step.
  void finish_gradients(const StageContextParts& parts, float token_scale);

  PipelineStepSetup setup_;
  std::size_t floats_;       // a chunk's input or output for one micro-batch
  Arena working_;            // what each action uses only while it runs
  std::vector<Slot> slots_;  // [micro-batch * chunks + chunk]
  std::vector<CommWork> sends_;
  StageTime time_;
  // Declared last, so destroyed first: its communicators finish (or end
  // the job on) the transfers still reading the buffers above before
  // those are freed, when a step ends in an error.
  StageLinks links_;
};

// What a stage's activations are made of, in bytes: a (micro-batch,
// chunk)'s arena from its forward to its backward (Model::
// kept_activation_bytes), the working arena the actions share (the rest
// of Model::activation_bytes), and one buffer between chunks (a chunk's
// input or output for one micro-batch, or its gradient: Model::
// stage_floats).
struct StageBytes {
  std::uint64_t kept = 0, working = 0, buffer = 0;
};

// The most activation bytes the executor holds at once on `stage` running
// `plan`: the working arena from the first action on; each chunk's arena
// from its forward to its backward; an input from its receive to its
// backward, an output from its forward to its backward, a received
// gradient to its backward, a sent input gradient to the step's end. What
// `estimate` says the stage holds, and what the device measures.
std::uint64_t stage_activations(const pipeline::SchedulePlan& plan, std::size_t stage,
                                const StageBytes& bytes);

struct Run;
// This rank's stage of the run's pipeline: the built-in schedule's plan
// for [parallel]'s shape and [train]'s gradient accumulation steps, the
// stage's chunks, and the tied parameters (whole-model parameters that
// several stages hold, each with its stage id in `params`).
PipelineStepSetup pipeline_setup(const Run& run, const ParamSpecs& params);

}  // namespace ztrain
