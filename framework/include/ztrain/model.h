// The model plugin interface, and what a model may touch while it runs.
//
// A Model declares its parameters (name, shape, initialiser, whether weight
// decay applies, and the modules that use each: a tied embedding is used by
// the first module and the last) and its modules in forward execution order.
// It owns no parameter memory: inside a module's enter/exit it reads
// parameters and accumulates gradients only through the views the
// StepContext hands out, which the strategy backs with full, sharded,
// gathered or offloaded storage the model never sees.
//
// forward_backward runs one micro-batch: forward module by module, the
// loss, then backward in reverse module order, calling the four hooks at
// every boundary. After exit_backward(m) the gradients of m's parameters are
// complete for this micro-batch. The step's loss is the mean over the
// trained tokens (targets other than kIgnoreTarget) of the whole global
// batch: each trained token's loss gradient is StepContext::token_scale().
// evaluate runs the forward only; forward_logits
// (optional) also hands out the logits. Activations come from the
// StepContext's Arena, one device allocation each, so the device measures
// what a micro-step holds; activation_bytes() is the model's estimate of it.
//
// Errors: a model raises ConfigError for an unusable shape, DataError for
// token ids outside the vocabulary.
// Thread safety: one step at a time; a model uses the device's threads
// through Kernels.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/ids.h"
#include "ztrain/kernels.h"
#include "ztrain/plugin.h"
#include "ztrain/sequence/split.h"
#include "ztrain/tensor.h"

namespace ztrain {

struct Init {
  enum class Kind : std::uint8_t { normal, zeros, ones, uniform };
  Kind kind = Kind::zeros;
  float std = 0.0f;  // for normal: N(0, std^2); for uniform: U(-std, std)
};

// Tensor parallelism (Megatron's): which part of the whole parameter this
// rank holds. dim -1: the whole, the same on every rank of the tensor
// group (a norm's weight, a row-parallel layer's bias); 0: rows (a
// column-parallel layer's output features), 1: columns (a row-parallel
// layer's input features). The whole is `sections` equal blocks along dim
// (GPT-2's c_attn: q, k and v), each cut into `parts` equal parts; this
// rank holds part `part` of every section, in section order. Where there
// are fewer parts than ranks (grouped key/value heads fewer than the
// degree), `copies` consecutive ranks hold each part (parts x copies is
// the group's size).
struct TensorSplit {
  int dim = -1;
  int parts = 1;
  int part = 0;
  int sections = 1;
  int copies = 1;
  // Parts of unequal rows (dim 0, one section: a vocabulary that the
  // degree does not divide): the whole's rows, of which part p holds
  // [first_row(p), first_row(p + 1)). 0: every part has this one's shape.
  std::int64_t whole = 0;
  std::int64_t first_row(int p) const { return whole * p / parts; }
  // The whole's extent along dim, of which this part holds `local`.
  std::int64_t whole_extent(std::int64_t local) const { return whole > 0 ? whole : local * parts; }
  // The whole parameter's flat (row-major) index of element i of this
  // rank's part, whose shape is `local` (a vector counts as one column).
  std::uint64_t whole_index(const Shape& local, std::uint64_t i) const {
    if (dim < 0) return i;
    const auto rows = static_cast<std::uint64_t>(local[0]);
    const std::uint64_t cols = local.rank() > 1 ? static_cast<std::uint64_t>(local[1]) : 1;
    std::uint64_t r = i / cols, c = i % cols;
    const auto P = static_cast<std::uint64_t>(parts), p = static_cast<std::uint64_t>(part);
    const auto S = static_cast<std::uint64_t>(sections);
    if (whole > 0) return (static_cast<std::uint64_t>(first_row(part)) + r) * cols + c;
    if (dim == 0) {
      const std::uint64_t each = rows / S;
      r = r / each * each * P + p * each + r % each;
      return r * cols + c;
    }
    const std::uint64_t each = cols / S;
    c = c / each * each * P + p * each + c % each;
    return r * cols * P + c;
  }
  // How many elements of the part from element i on sit at consecutive
  // whole indices (to the end of i's row of a section, its section's
  // rows, or the part): the runs a checkpoint stores a part's ranges in.
  std::uint64_t run_length(const Shape& local, std::uint64_t i) const {
    const auto numel = static_cast<std::uint64_t>(local.numel());
    if (dim < 0 || whole > 0 || parts == 1) return numel - i;
    const std::uint64_t cols = local.rank() > 1 ? static_cast<std::uint64_t>(local[1]) : 1;
    const auto S = static_cast<std::uint64_t>(sections);
    if (dim == 0) {
      const std::uint64_t each = static_cast<std::uint64_t>(local[0]) / S * cols;
      return (i / each + 1) * each - i;
    }
    const std::uint64_t each = cols / S, c = i % cols;
    return (c / each + 1) * each - c;
  }
  bool operator==(const TensorSplit&) const = default;
};

// How a model is split over a tensor-parallel group (Model::split_tensors).
struct TensorParallel {
  int degree = 1;
  int part = 0;  // this rank's, 0 .. degree - 1
  // Megatron's sequence parallelism: the rows of the residual stream, the
  // norms and the embedding's output split over the group as well.
  bool sequence = false;
};

struct ParamSpec {
  std::string name;
  Shape shape;
  Init init;
  bool decay = true;
  std::vector<ModuleId> used_by;
  // How the parameter appears in Hugging Face checkpoints: its name there
  // (empty: the same as `name`) and whether the file stores the transpose
  // (GPT-2's Conv1D weights are (in, out)). Import also accepts `name`.
  std::string hf_name;
  bool hf_transposed = false;
  // False for a frozen parameter (a fine-tuning method's base weights):
  // it has no gradient and no optimizer state, StepContext::grad() hands
  // out a null view of it, and a checkpoint does not store it (it comes
  // back from the base weights, [model] init_from, or the seed).
  bool trainable = true;
  // An adapter a fine-tuning method adds (LoRA's A and B): not in the base
  // model's files, so an import of the base leaves it at its initial
  // value; exported in PEFT's adapter format.
  bool adapter = false;
  // Under tensor parallelism, the part of the whole `shape` is (its shape
  // is the part's); the whole by default. A part starts at the values the
  // whole would (TensorSplit::whole_index), and the gradient norm counts a
  // parameter the tensor group shares (dim -1) once.
  TensorSplit split = {};
  // Under pipeline parallelism (Model::split_stages) a stage declares only
  // the parameters its modules use: the id each has in the whole model,
  // which its seeded initial values, checkpoints and export name it by
  // (none: its own id, the model is whole).
  std::optional<ParamId> model_id = std::nullopt;
  // A tied parameter another stage holds as well (the head's copy of the
  // embedding on the last stage): the host sums the two gradients before
  // the step, and the gradient norm counts the parameter on the other
  // stage alone.
  bool tied_copy = false;
};

// Pipeline parallelism: modules [first, end) of the model's execution
// order, one chunk of a pipeline stage (pipeline/stage_partition.h makes
// them).
struct ModuleRange {
  std::size_t first = 0, end = 0;
  bool contains(ModuleId m) const { return index_of(m) >= first && index_of(m) < end; }
  bool operator==(const ModuleRange&) const = default;
};

// One chunk's run on one micro-batch (Model::stage_forward, stage_backward).
// input: the previous chunk's output (stage_floats of it), null where the
// chunk begins with the model's first module (it reads the batch's
// tokens). output: where forward writes what the next chunk reads; null on
// the chunk ending with the last module (its loss comes with its
// backward, which may compute the last module's forward there).
// output_grad: the loss's gradient of the output, from the next chunk;
// null on the last, whose backward starts at the loss. input_grad: where
// backward writes the gradient of the input; null on the first chunk.
// evaluate: a forward with no backward to come (evaluation), in which the
// chunk holding the last module reports the losses.
struct StageRun {
  ModuleRange modules;
  const float* input = nullptr;
  float* output = nullptr;
  const float* output_grad = nullptr;
  float* input_grad = nullptr;
  bool evaluate = false;
};

struct ModuleSpec {
  std::string name;  // "embed", "block.0", ..., "head"
};

// A model's parameters and modules, each indexed by its id.
using ParamSpecs = IdVector<ParamId, ParamSpec>;
using ModuleSpecs = IdVector<ModuleId, ModuleSpec>;

// Whether any of `params` is frozen (ParamSpec::trainable false).
inline bool has_frozen(const ParamSpecs& params) {
  for (const ParamSpec& p : params)
    if (!p.trainable) return true;
  return false;
}

// Whether `params` are a tensor-parallel model's parts (some ParamSpec::
// split cut).
inline bool has_tensor_parts(const ParamSpecs& params) {
  for (const ParamSpec& p : params)
    if (p.split.dim >= 0) return true;
  return false;
}

// The elements of the whole parameter `p` is a part of (p's own where it
// is not split).
inline std::int64_t whole_numel(const ParamSpec& p) {
  if (p.split.dim < 0) return p.shape.numel();
  const std::int64_t along = p.shape[static_cast<std::size_t>(p.split.dim)];
  return along == 0 ? 0 : p.shape.numel() / along * p.split.whole_extent(along);
}

struct BatchShape {
  int batch = 0;
  int seq_len = 0;  // tokens of each row this rank holds
  // How each sequence is split across ranks (sequence and context
  // parallelism): a row holds 1/split.shards() of its sequence, of
  // seq_len * split.shards() tokens, the tokens shard_spans gives its
  // rank (ztrain/sequence/split.h).
  SequenceSplit split = {};
  // The type the activations a backward reads are kept in: the run's
  // precision, or fp32 ([train] activation_dtype). A 16-bit type means
  // each such tensor is rounded to it where it is produced, before
  // anything reads it, and held in it until its backward; the arithmetic,
  // the norms' statistics, the loss and the activations' gradients stay
  // fp32.
  DType activations = DType::f32;
};

// One micro-batch: inputs and targets (B,T) token ids; positions (B,T)
// where rows pack several examples (DataSource::fill_positions), else null.
struct Batch {
  BatchShape shape;
  const std::int32_t* inputs = nullptr;
  const std::int32_t* targets = nullptr;
  const std::int32_t* positions = nullptr;
};

// A LoRA adapter beside a frozen weight (out, in): A (rank, in), B (out,
// rank); the model computes W + scale * B A, and so does a merged export.
struct AdapterOf {
  ParamId weight, a, b;
  float scale = 1;
};

struct ModelInfo {
  std::string arch;
  int vocab_size = 0;
  int seq_len = 0;
  std::int64_t n_params = 0;
  // Forward+backward FLOPs per token (6N plus attention), for MFU.
  double train_flops_per_token = 0;
};

// Activations of a micro-step. Each request is its own device allocation
// (device tier, category `activations`, 64-byte multiples, contents
// undefined: the model writes before it reads; alloc_host_f32's in the
// host tier, for what a model keeps there until backward), and reset()
// returns them all, so the device's peak of the category is what the model
// really held at once, measured, where activation_bytes() and
// host_activation_bytes() only predict it. The device
// keeps freed blocks for reuse, so a step asking for the same sizes again
// costs no fresh pages.
//
// A pipeline stage keeps a chunk's activations from its forward to its
// backward on the same micro-batch, several micro-batches at once: the
// host gives each (micro-batch, chunk) an arena of its own, and backward
// calls rewind() and requests the same sizes in the same order, getting
// back what its forward left there. What a call needs only while it runs
// (a backward's gradient scratch) it requests with alloc_working_f32,
// which such an arena takes from the working arena the micro-batches
// share; reset() and rewind() start that one afresh too.
// Ownership: owns its allocations; the working arena, when given,
// outlives it. Errors: OutOfMemoryError past the device budget;
// InternalError for a request that does not match the one it replays.
class ZTRAIN_API Arena {
 public:
  explicit Arena(Device& device, Arena* working = nullptr) : device_(device), working_(working) {}
  float* alloc_f32(std::size_t n);
  // n floats of host memory the device copies to and from (pinned on a
  // GPU), for Device::copy_async.
  float* alloc_host_f32(std::size_t n);
  std::int32_t* alloc_i32(std::size_t n);
  // n floats of device memory the caller uses only until it returns: the
  // working arena's where there is one, else this arena's.
  float* alloc_working_f32(std::size_t n);
  // n token ids from host memory where the kernels can read them: the
  // same pointer when the host can touch the device tier, else a copy in
  // this arena.
  const std::int32_t* on_device(const std::int32_t* host, std::size_t n);
  // The device the arena allocates from (for copies and fills).
  Device& device() { return device_; }
  // Returns every allocation; earlier pointers are invalid.
  void reset();
  // Keeps every allocation, contents and all, and hands them out again:
  // the next requests (alloc_f32, alloc_host_f32, alloc_i32) get the
  // allocations made since the last reset, in the order they were made,
  // each of the same size and tier as the one it replays.
  void rewind();
  // Device bytes handed out since the last reset.
  std::size_t used() const { return used_; }
  static std::size_t aligned(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

 private:
  void* take(Tier tier, std::size_t bytes);
  void* replay(Tier tier, std::size_t bytes);
  Device& device_;
  Arena* working_;
  std::vector<Buffer> buffers_;
  std::size_t used_ = 0;
  std::optional<std::size_t> replayed_;  // while rewound: the allocations handed out again
};

// The mean losses of micro-batches, added up where the kernels run: the
// model reports a micro-batch's per-token losses without waiting for them
// (a GPU goes on into backward), and the caller reads the total once per
// step. Owns one double in the device tier (category grads).
// Thread safety: one thread at a time.
class ZTRAIN_API LossSum {
 public:
  LossSum(Device& device, const Kernels& kernels);
  // Adds the mean of losses (n, where the kernels reach), rounded to fp32.
  void add(const float* losses, std::size_t n);
  // The total since the last take, and starts again from zero. A copy to
  // the host: on a GPU it waits for the work queued before it.
  double take();

 private:
  Device& device_;
  const Kernels& kernels_;
  Buffer total_;
};

class Strategy;

// What the model may touch while it runs. Made by the host for each
// micro-batch; forwards the hooks to the strategy and checks that every
// parameter view is taken inside a module that uses the parameter.
class ZTRAIN_API StepContext {
 public:
  StepContext(Strategy& strategy, const ParamSpecs& params, const Kernels& kernels, Arena& arena,
              LossSum& losses, float token_scale);

  void enter_forward(ModuleId m);
  void exit_forward(ModuleId m);
  void enter_backward(ModuleId m);
  void exit_backward(ModuleId m);

  // Valid between enter and exit of a module in the parameter's used_by.
  // In the run's precision (param) and grad_accum_dtype (grad): pass them
  // to the kernels as they are (ConstTypedPtr/TypedPtr). A frozen
  // parameter's gradient (ParamSpec::trainable false) is a null view: the
  // kernels compute no gradient where theirs is null.
  TensorView param(ParamId p);
  TensorView grad(ParamId p);

  // The ranks sharing this micro-batch's sequences: the Ulysses group
  // (sequence parallelism, the batch's split.sequence ranks) and the ring
  // (context parallelism, split.context ranks); this rank holds the tokens
  // of every row that shard_spans gives its ranks in them. Null where the
  // degree is 1. The host owns them (splits of the strategy's
  // communicator, on the same memory: host for cpu, device for nccl); they
  // live as long as the run. Every rank of a group runs the same
  // micro-batch through the same modules, so any collective is legal on
  // it as long as each rank issues the same ones in the same order; the
  // strategy's own collectives (its communicator spans the groups) are
  // issued from the hooks, between modules, never inside one.
  Communicator* sequence_group() const { return sequence_group_; }
  Communicator* context_group() const { return context_group_; }
  void set_sequence_groups(Communicator* sequence, Communicator* context) {
    sequence_group_ = sequence;
    context_group_ = context;
  }
  // The tensor-parallel group (Model::split_tensors' degree ranks, this
  // rank at its part), on the same terms as the sequence groups; null at
  // degree 1.
  Communicator* tensor_group() const { return tensor_group_; }
  void set_tensor_group(Communicator* tensor) { tensor_group_ = tensor; }

  Arena& activations() { return arena_; }
  const Kernels& kernels() const { return kernels_; }
  // d(step loss) / d(loss of one trained token), times the loss scale and
  // the ranks the strategy averages gradients over: loss scale x ranks /
  // trained tokens of the global batch (every rank's micro-batches of the
  // step). The model's gradient of each trained token's loss; a token whose
  // target is kIgnoreTarget gets none.
  float token_scale() const { return token_scale_; }
  // The micro-batch's per-token losses (n, in the arena; 0 where the target
  // is kIgnoreTarget). Reported once per forward; the host weighs them.
  void add_loss(const float* losses, std::size_t n) { losses_.add(losses, n); }

 private:
  void check_usable(ParamId p, const char* what) const;
  Strategy& strategy_;
  const ParamSpecs& params_;
  const Kernels& kernels_;
  Arena& arena_;
  LossSum& losses_;
  float token_scale_;
  Communicator* sequence_group_ = nullptr;
  Communicator* context_group_ = nullptr;
  Communicator* tensor_group_ = nullptr;
  IdVector<ModuleId, int> active_;  // per module: entered and not yet exited
};

class ZTRAIN_API Model : public Plugin {
 public:
  ~Model() override;
  virtual ModelInfo info() const = 0;
  virtual ParamSpecs params() const = 0;
  virtual ModuleSpecs modules() const = 0;  // forward execution order
  // Bytes of activations one micro-step of this batch shape allocates from
  // the arena at its peak (the estimate; the device measures the run).
  virtual std::uint64_t activation_bytes(const BatchShape& shape) const = 0;
  // Bytes of host memory it allocates at its peak (Arena::alloc_host_f32:
  // offloaded activations); none by default.
  virtual std::uint64_t host_activation_bytes(const BatchShape& shape) const;
  // One micro-batch forward and backward; reports its losses through
  // ctx.add_loss.
  virtual void forward_backward(const Batch& batch, StepContext& ctx) = 0;
  // Forward only; reports its losses through ctx.add_loss.
  virtual void evaluate(const Batch& batch, StepContext& ctx) = 0;
  // Why this model cannot split its sequences this way (the reason, for a
  // message that says where the degrees were set); empty when it can. A
  // model that runs only whole sequences says so, the default.
  virtual std::string sequence_shards_refusal(SequenceSplit split) const;
  // Why this model cannot train rows that pack several examples
  // (Batch::positions); empty when it can. The default: it cannot.
  virtual std::string segments_refusal() const;
  // Tensor parallelism: makes this the part `t.part` of the model split
  // over `t.degree` ranks and returns empty, params() then describing this
  // rank's parts (ParamSpec::split); or returns why the model cannot be
  // split so, and stays whole. With t.sequence (Megatron's sequence
  // parallelism) the tokens between the split regions are split over the
  // group too. Called at most once, before params() is first read;
  // forward and backward then run with StepContext::tensor_group(). The
  // default: it cannot.
  virtual std::string split_tensors(const TensorParallel& t);
  // Pipeline parallelism: makes this a stage that runs `chunks` (its
  // modules, in chunk order; modules() stays the whole model's) and
  // returns empty, params() then listing only the parameters those
  // modules use, each with its ParamSpec::model_id (a tied one that
  // another stage holds too marked tied_copy on the later stage); or
  // returns why it cannot, and stays whole. Called at most once, after
  // split_tensors and before params() is read. The default: it cannot.
  virtual std::string split_stages(const std::vector<ModuleRange>& chunks);
  // Floats a chunk passes to the next for one micro-batch of `shape` (a
  // stage's activations between its modules: the transformer's residual
  // stream, this rank's rows of it).
  virtual std::uint64_t stage_floats(const BatchShape& shape) const;
  // A chunk's forward on one micro-batch, and its backward. Between them
  // the host keeps run.input alive and the (micro-batch, chunk)'s arena
  // as forward left it: backward rewinds it (Arena::rewind) and reads the
  // forward's activations instead of recomputing them, so a stage holds
  // the activations of as many micro-batches as its schedule has between
  // forwards and backwards (1F1B: at most the pipeline's depth; GPipe:
  // all). Backward reports the losses (ctx.add_loss) on the chunk holding
  // the last module.
  virtual void stage_forward(const Batch& batch, const StageRun& run, StepContext& ctx);
  virtual void stage_backward(const Batch& batch, const StageRun& run, StepContext& ctx);
  // Of activation_bytes(shape), the bytes a chunk keeps from its forward
  // to its backward on a pipeline stage: all but its working ones
  // (Arena::alloc_working_f32), which the stage's micro-batches share.
  // All of them by default.
  virtual std::uint64_t kept_activation_bytes(const BatchShape& shape) const;
  // Forward only; logits receives the (B,T,V) pre-softmax outputs (what an
  // independent implementation is compared on). Optional: models that do
  // not offer it raise Error, the default.
  virtual void forward_logits(const Batch& batch, StepContext& ctx, float* logits);
  // The Hugging Face config.json describing this model (empty: none), so an
  // exported directory loads with from_pretrained.
  virtual std::string hf_config_json() const { return {}; }
  // Tensors a Hugging Face file may carry that are not parameters here (tied
  // copies, attention-mask buffers); import skips them instead of failing.
  virtual bool ignorable_tensor(const std::string& /*name*/) const { return false; }
  // The LoRA adapters the model declared (ParamSpec::adapter), each with
  // its weight, and PEFT's adapter_config.json describing them (without
  // base_model_name_or_path, which the host knows); none by default.
  virtual std::vector<AdapterOf> adapters() const { return {}; }
  virtual std::string adapter_config_json() const { return {}; }
};

}  // namespace ztrain
