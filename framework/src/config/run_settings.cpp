#include "config/run_settings.h"

#include <climits>
#include <cmath>
#include <sstream>

#include "config/lr_schedule.h"

#include "loader/cuda_loader.h"
#include "ztrain/error.h"
#include "ztrain/pipeline/schedule.h"
#include "ztrain/pipeline/stage_partition.h"

namespace ztrain {

OptionList train_options() {
  OptionList o;
  o.integer("steps", 300, "optimizer steps to run").at_least(1);
  o.number("epochs", 0,
           "passes over the training data instead of steps (the steps they take are counted "
           "when the data opens: LLaMA-Factory's num_train_epochs); 0: steps")
      .at_least(0);
  o.string("epoch_steps", "ztrain",
           "how epochs count steps: ztrain (the training sequences times epochs, in global "
           "batches, rounded up) or transformers (the Trainer's: each rank's share in "
           "micro-batches, accumulations rounded up per epoch, times epochs rounded up)")
      .one_of({"ztrain", "transformers"});
  o.integer("micro_batch_size", 8,
            "sequences per rank per micro-step (DeepSpeed: train_micro_batch_size_per_gpu)")
      .at_least(1)
      .as_int();
  o.integer("grad_accum", 1,
            "micro-steps per optimizer step (DeepSpeed: gradient_accumulation_steps)")
      .at_least(1)
      .as_int();
  o.integer("global_batch_size", 0,
            "sequences per optimizer step over all ranks (DeepSpeed: train_batch_size)")
      .at_least(1)
      .as_int();
  declare_schedule_options(o);
  o.number("weight_decay", 0.1, "Adam's weight decay (matrices only), as weight_decay_mode says")
      .at_least(0);
  o.string("weight_decay_mode", "decoupled",
           "\"decoupled\": AdamW (p shrinks by lr * weight_decay * p; torch.optim.AdamW, "
           "DeepSpeed's Adam); \"l2\": weight_decay * p added to the gradient "
           "(torch.optim.Adam's weight_decay, DeepSpeed's adam_w_mode false)")
      .one_of({"decoupled", "l2"});
  o.numbers("betas", {0.9, 0.95}, "AdamW (beta1, beta2)").at_least(0).at_most(0.999999);
  o.number("eps", 1e-8, "AdamW epsilon").at_least(0);
  o.number("grad_clip", 1.0, "clip the global gradient norm to this; 0 disables").at_least(0);
  o.string("precision", "fp32",
           "working precision of parameters and gradients (16-bit keeps fp32 master weights "
           "in the optimizer)")
      .one_of({"fp32", "bf16", "fp16"});
  o.optional_string("grad_accum_dtype",
                    "type gradients are held, accumulated across micro-steps and reduced in: "
                    "fp32 or the precision (unset: the precision, as DeepSpeed)");
  o.optional_string("activation_dtype",
                    "type the activations a backward reads are kept in between forward and "
                    "backward: fp32 or the precision (unset: the precision, as torch's bf16 "
                    "and DeepSpeed's runs hold them); the arithmetic stays fp32");
  o.integer("seed", 0, "parameter initialisation seed").at_least(0);
  o.integer("log_every", 10, "steps between logged metrics lines").at_least(1);
  o.integer("print_every", 0,
            "steps between console lines (0: log_every; DeepSpeed: steps_per_print)")
      .at_least(0);
  o.integer("eval_every", 100, "steps between evaluations on the held-out split; 0 disables")
      .at_least(0);
  o.integer("eval_batches", 8,
            "global batches of the val split in one evaluation (the same sequences at any world "
            "size)")
      .at_least(1)
      .as_int();
  o.integer("sample_every", 0,
            "steps between text samples from the model, printed and written to metrics.jsonl "
            "(needs the data's tokenizer: tokens made by `ztrain prepare`); 0 disables")
      .at_least(0);
  o.string("sample_prompt", "", "text the samples continue (after the document-start token)");
  o.integer("sample_tokens", 64, "tokens in each sample").at_least(1).at_most(100000).as_int();
  o.number("sample_temperature", 1.0, "sampling temperature; 0: greedy").at_least(0);
  o.integer("sample_top_k", 0, "draw among the k likeliest tokens; 0: all").at_least(0).as_int();
  o.string("out_dir", "runs/default",
           "run directory: metrics.jsonl, config.toml, and the final weights (model.safetensors "
           "with config.json, Hugging Face layout)");
  o.integer("checkpoint_every", 0,
            "steps between checkpoints (out_dir/step_<N>), also written at the end and on "
            "SIGINT/SIGTERM; 0: only on SIGINT/SIGTERM")
      .at_least(0);
  o.string("checkpoint_write", "auto",
           "\"background\": write checkpoints from a copy in host memory (host tier, category "
           "checkpoint) on a background thread while training goes on; \"in_step\": within the "
           "step; \"auto\": background where a core is left free for it (a GPU run, or fewer "
           "compute threads than cores on the host), else in_step")
      .one_of({"auto", "background", "in_step"});
  o.integer("keep_last", 2, "checkpoints kept in out_dir, the newest; 0 keeps all").at_least(0);
  o.optional_string("resume",
                    "continue from a checkpoint: \"latest\" (out_dir's; also `resume = true`), a "
                    "step_<N> directory, or a run directory (its latest); --resume sets it");
  o.flag("save_final", true, "write the final weights into out_dir");
  o.flag("tensorboard", false,
         "write TensorBoard event files (scalars of every logged step) to tensorboard_dir");
  o.optional_string("tensorboard_dir",
                    "where TensorBoard's event files go (giving it turns them on); unset: "
                    "out_dir/tensorboard");
  o.optional_string("export_to",
                    "also write the final weights here (.safetensors file or directory)");
  o.string("export_dtype", "fp32", "dtype of export_to").one_of({"fp32", "bf16", "fp16"});
  o.number("fp16.loss_scale", 0, "0 = dynamic loss scaling, else a static scale").at_least(0);
  o.integer("fp16.initial_scale_power", 16, "dynamic scaling starts at 2^this")
      .at_least(0)
      .at_most(64);
  o.integer("fp16.loss_scale_window", 1000, "clean steps before the scale doubles").at_least(1);
  o.integer("fp16.hysteresis", 2, "overflows tolerated before the scale halves").at_least(1);
  o.number("fp16.min_loss_scale", 1, "an overflow at this scale stops the run").at_least(0);
  o.flag("fp16.consecutive_hysteresis", false,
         "every clean step refills the hysteresis (else only a doubling does)");
  return o;
}

OptionList device_options() {
  OptionList o;
  o.string("kind", "cpu",
           "where the model runs: cpu, cuda (one GPU per rank, by local rank), auto (cuda "
           "where a GPU and the CUDA backend are, else cpu)")
      .one_of({"cpu", "cuda", "auto"});
  o.size("memory_limit", 0, "budget of the device tier; 0 = no budget");
  o.integer("threads", 0,
            "kernel threads per rank; 0 = the CPUs it may use, shared by the ranks on its host")
      .at_least(0)
      .at_most(1024);
  o.string("bind_cores", "auto",
           "ranks sharing a host on cores of their own: auto (when their threads fill the CPUs "
           "they may use), on (always), off (left to the scheduler)")
      .one_of({"auto", "on", "off"});
  o.flag("tf32", false, "cuda: fp32 GEMMs may round their inputs to TF32 on tensor cores");
  o.flag("pin_memory", true, "cuda: the host tier in pinned memory (asynchronous copies)");
  o.flag("guard", false,
         "cpu, world 1: page-protect the device tier between kernel, copy and collective calls, "
         "so host code that touches it faults as it would fail on a GPU (slow; a check for "
         "models and strategies)");
  return o;
}

OptionList comm_options() {
  OptionList o;
  o.string("backend", "auto",
           "collective backend: auto (mpi under an MPI launcher, gloo under RANK/WORLD_SIZE, "
           "else local), local, mpi, gloo, nccl (tcp: gone, see gloo)")
      .one_of({"auto", "local", "mpi", "gloo", "tcp", "nccl"});
  o.duration("timeout", 300, "a collective waiting longer aborts the job");
  o.flag("shared_memory", true,
         "ranks that all share one host run their collectives through a shared-memory segment "
         "(faster than gloo's TCP and Open MPI's own); false: through the backend's transport");
  return o;
}

OptionList parallel_options() {
  OptionList o;
  o.integer("tensor", 1,
            "tensor-parallel degree (Megatron's): each layer's matmuls split over this many ranks")
      .at_least(1)
      .as_int();
  o.integer("sequence", 1,
            "sequence-parallel degree (DeepSpeed-Ulysses): each sequence split over this many "
            "ranks, attention split by heads")
      .at_least(1)
      .as_int();
  o.integer("context", 1,
            "context-parallel degree (ring attention, Megatron's name): each sequence split over "
            "this many ranks, keys and values passed around them")
      .at_least(1)
      .as_int();
  o.integer("pipeline", 1, "pipeline stages: the layers split over this many ranks")
      .at_least(1)
      .as_int();
  o.string("pipeline_schedule", "1f1b",
           "with pipeline > 1, the schedule: gpipe, 1f1b or interleaved (Megatron's, with "
           "pipeline_chunks > 1); the micro-batches are [train]'s gradient accumulation steps");
  o.integer("pipeline_chunks", 1,
            "model chunks a pipeline stage holds (interleaved: each stage runs every "
            "pipeline-th slice of the layers)")
      .at_least(1)
      .as_int();
  o.string("pipeline_partition", "parameters",
           "how the modules (embedding, blocks, head) are cut into stages: parameters (the "
           "heaviest stage as light as can be) or uniform (as many modules each)");
  o.integer("expert", 1, "expert-parallel degree: a mixture of experts split over this many ranks")
      .at_least(1)
      .as_int();
  o.flag("tensor_sequence", false,
         "with tensor > 1, Megatron's sequence parallelism: the residual stream, the norms and "
         "the embedding's output split by tokens over the tensor group (all-gathers and "
         "reduce-scatters in place of its all-reduces), their activations divided by tensor");
  return o;
}

DType parse_precision(const std::string& name, const std::string& where) {
  if (name == "fp32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  if (name == "fp16") return DType::f16;
  throw ConfigError(where + ": unknown precision \"" + name + "\" (fp32, bf16 or fp16)");
}

const char* precision_label(DType t) {
  return t == DType::f32 ? "fp32" : t == DType::bf16 ? "bf16" : "fp16";
}

namespace {

// A type key of [train] that may be fp32 or the precision (unset: the
// precision); `rule` says so in the refusal.
DType fp32_or_precision(const Options& t, const char* key, DType precision, const char* rule) {
  if (!t.has_value(key)) return precision;
  const std::string where = t.where(key);
  const DType type = parse_precision(t.get_string(key), where);
  if (type == DType::f32 || type == precision) return type;
  throw ConfigError(where + ": [train] " + key + " \"" + t.get_string(key) +
                    "\" with precision \"" + t.get_string("precision") + "\": " + rule + "; use " +
                    (precision == DType::f32
                         ? std::string("\"fp32\"")
                         : "\"fp32\" or \"" + t.get_string("precision") + "\""));
}

std::int64_t derive(std::int64_t total, std::int64_t part, const std::string& what,
                    const std::string& where) {
  if (total % part != 0)
    throw ConfigError(where + ": [train] global_batch_size " + std::to_string(total) +
                      " is not divisible by " + what + " (" + std::to_string(part) +
                      "); make global_batch_size = micro_batch_size * grad_accum * world");
  return total / part;
}

// "auto" takes the GPU where this process can train on one
// (cuda_unusable); "cuda" is checked when the run opens the
// device (trainer.cpp), so `estimate` of a GPU run works anywhere.
DeviceSettings resolve_device(const Options& d) {
  DeviceSettings s;
  s.kind = d.get_string("kind");
  s.kind_where = d.where("kind");
  if (s.kind == "auto") s.kind = cuda_unusable().empty() ? "cuda" : "cpu";
  if (d.get_size("memory_limit") > 0) s.memory_limit = d.get_size("memory_limit");
  s.threads = static_cast<int>(d.get_int("threads"));
  s.tf32 = d.get_bool("tf32");
  s.pin_memory = d.get_bool("pin_memory");
  s.guard = d.get_bool("guard");
  s.bind_cores = d.get_string("bind_cores");
  if (s.guard && s.kind != "cpu")
    throw ConfigError(d.where("guard") +
                      ": [device] guard checks on the cpu what a GPU would "
                      "refuse; it has no use on kind \"" +
                      s.kind + "\"");
  return s;
}

// The data-parallel degree: what the other dimensions leave of the world.
std::int64_t data_ranks(const RunConfig& config, const ParallelSettings& p, int world) {
  const int per_replica = p.model_ranks();
  if (world % per_replica == 0) return world / per_replica;
  // Named by the degree that splits: the sequence's, else the tensor's or
  // the pipeline's (whichever is above 1).
  const bool split = p.split().shards() > 1;
  const std::string key =
      "parallel." + (split ? p.split_key() : std::string(p.tensor > 1 ? "tensor" : "pipeline"));
  throw ConfigError(config.where(key) + ": [parallel] tensor x sequence x context x pipeline = " +
                    std::to_string(per_replica) + " ranks per copy of the model do not divide " +
                    "the world of " + std::to_string(world) + " rank" + (world == 1 ? "" : "s") +
                    "; start a multiple of " + std::to_string(per_replica) +
                    " ranks or lower the degrees (--set " + key + "=1 runs " +
                    (split          ? "whole sequences on every rank"
                     : p.tensor > 1 ? "whole blocks on every rank"
                                    : "every layer on every rank") +
                    "; a checkpoint resumes on any mesh)");
}

// [train] epochs, where it decides the run's length: given with steps,
// the command line's wins over a run file's, and two of the same standing
// contradict each other.
double epochs_of(const Options& t) {
  const double epochs = t.get_number("epochs");
  if (epochs == 0 || !t.given("steps")) return epochs;
  const auto from_cli = [&](const char* key) { return t.where(key).starts_with("--set"); };
  if (from_cli("epochs") == from_cli("steps"))
    throw ConfigError(t.where("epochs") + ": [train] epochs and steps (" + t.where("steps") +
                      ") both say how long to train; give one");
  return from_cli("epochs") ? epochs : 0;
}

}  // namespace

std::string steps_from_epochs(RunSettings& s, const RunConfig& config,
                              std::optional<std::uint64_t> sequences) {
  TrainSettings& tr = s.train;
  const Options t = config.validate("train", train_options());
  if (!sequences || *sequences == 0)
    throw ConfigError(t.where("epochs") +
                      ": [train] epochs counts passes over the training data, and this source "
                      "is endless; give steps instead");
  const bool trainer = t.get_string("epoch_steps") == "transformers";
  const auto up = [](std::uint64_t n, std::uint64_t d) { return (n + d - 1) / d; };
  // The Trainer: a DistributedSampler's share per rank, its batches, the
  // optimizer steps of an epoch (a partial accumulation is one), times
  // the epochs.
  const auto world = static_cast<std::uint64_t>(tr.global_batch / (tr.micro_batch * tr.grad_accum));
  const double per_epoch =
      trainer ? static_cast<double>(std::max<std::uint64_t>(
                    1, up(up(up(*sequences, world), static_cast<std::uint64_t>(tr.micro_batch)),
                          static_cast<std::uint64_t>(tr.grad_accum))))
              : static_cast<double>(*sequences) / static_cast<double>(tr.global_batch);
  const double steps = std::ceil(tr.epochs * per_epoch);
  if (steps > static_cast<double>(INT64_MAX / tr.global_batch))
    throw ConfigError(t.where("epochs") + ": [train] epochs = " + std::to_string(tr.epochs) +
                      " of " + std::to_string(*sequences) +
                      " sequences passes the 64-bit count of sequences; train fewer");
  tr.steps = static_cast<std::int64_t>(steps);
  tr.schedule = schedule_of(t, tr.steps);
  std::ostringstream note;
  note << "steps: " << tr.steps << ", for epochs = " << tr.epochs << " (" << t.where("epochs")
       << ") of " << *sequences << " training sequences at " << tr.global_batch << " a step"
       << (trainer ? ", counted as transformers' Trainer counts them" : "")
       << (t.given("steps") ? " (in place of steps = " + std::to_string(t.get_int("steps")) + ", " +
                                  t.where("steps") + ")"
                            : std::string());
  return note.str();
}

namespace {

// What a tensor- or pipeline-parallel run cannot do yet: sampling
// (generation runs the whole model on one rank), refused naming its key.
// Its checkpoints hold the whole model's state (checkpoint/tensor_parts.h),
// its final weights and export are gathered whole (checkpoint/weights.h).
void refuse_with_parts(const Options& t, const TrainSettings& tr, const ParallelSettings& par) {
  if (tr.sample.every <= 0) return;
  const auto refuse = [&](const char* key, int degree, const char* rank) {
    throw ConfigError(t.where("sample_every") + ": [train] sample_every > 0 with [parallel] " +
                      key + " = " + std::to_string(degree) +
                      ": generation runs the whole model on one rank, and " + rank +
                      "; set sample_every = 0 and sample from the saved weights (`ztrain "
                      "sample`)");
  };
  if (par.tensor > 1) refuse("tensor", par.tensor, "a tensor-parallel rank holds parts of it");
  if (par.pipeline > 1)
    refuse("pipeline", par.pipeline, "a pipeline stage holds some of its layers");
}

}  // namespace

RunSettings resolve_settings(const RunConfig& config, int world) {
  RunSettings s;
  const Options t = config.validate("train", train_options());
  auto& tr = s.train;
  tr.steps = t.get_int("steps");
  tr.epochs = epochs_of(t);
  tr.schedule = schedule_of(t, tr.steps);
  tr.optimizer.weight_decay = t.get_number("weight_decay");
  tr.optimizer.decay_mode =
      t.get_string("weight_decay_mode") == "l2" ? WeightDecayMode::l2 : WeightDecayMode::decoupled;
  const auto& betas = t.get_numbers("betas");
  if (betas.size() != 2)
    throw ConfigError(t.where("betas") +
                      ": [train] betas: expected two numbers [beta1, beta2], got " +
                      std::to_string(betas.size()));
  tr.optimizer.beta1 = betas[0];
  tr.optimizer.beta2 = betas[1];
  tr.optimizer.eps = t.get_number("eps");
  tr.grad_clip = t.get_number("grad_clip");
  tr.precision = parse_precision(t.get_string("precision"), t.where("precision"));
  tr.grad_dtype =
      fp32_or_precision(t, "grad_accum_dtype", tr.precision,
                        "gradients are accumulated in fp32 or in the working precision");
  tr.activation_dtype =
      fp32_or_precision(t, "activation_dtype", tr.precision,
                        "activations are kept in fp32 or in the working precision");
  tr.seed = static_cast<std::uint64_t>(t.get_int("seed"));
  tr.log_every = t.get_int("log_every");
  tr.print_every = t.get_int("print_every") > 0 ? t.get_int("print_every") : tr.log_every;
  tr.eval_every = t.get_int("eval_every");
  tr.eval_batches = t.get_int("eval_batches");
  tr.sample = {t.get_int("sample_every"), t.get_string("sample_prompt"),
               static_cast<int>(t.get_int("sample_tokens")), t.get_number("sample_temperature"),
               static_cast<int>(t.get_int("sample_top_k"))};
  tr.out_dir = t.get_string("out_dir");
  tr.save_final = t.get_bool("save_final");
  tr.checkpoint_every = t.get_int("checkpoint_every");
  tr.checkpoint_write = t.get_string("checkpoint_write");
  tr.keep_last = t.get_int("keep_last");
  if (t.has_value("resume")) tr.resume = t.get_string("resume");
  if (t.has_value("export_to")) tr.export_to = t.get_string("export_to");
  if (t.has_value("tensorboard_dir") && t.given("tensorboard") && !t.get_bool("tensorboard"))
    throw ConfigError(t.where("tensorboard_dir") +
                      ": [train] tensorboard_dir is given with tensorboard = false; drop one");
  if (t.has_value("tensorboard_dir"))
    tr.tensorboard_dir = t.get_string("tensorboard_dir");
  else if (t.get_bool("tensorboard"))
    tr.tensorboard_dir = tr.out_dir / "tensorboard";
  tr.export_dtype = parse_precision(t.get_string("export_dtype"), t.where("export_dtype"));
  // DeepSpeed scales only fp16 losses; bf16 and fp32 keep a static 1.
  if (tr.precision == DType::f16)
    tr.scaler = {t.get_number("fp16.loss_scale"),           t.get_int("fp16.initial_scale_power"),
                 t.get_int("fp16.loss_scale_window"),       t.get_int("fp16.hysteresis"),
                 t.get_bool("fp16.consecutive_hysteresis"), t.get_number("fp16.min_loss_scale")};
  else
    tr.scaler = {1, 0, 1, 1, false, 1};

  const bool has_m = t.given("micro_batch_size"), has_a = t.given("grad_accum");
  // The command line outranks the run file: a run file's global batch yields
  // to micro_batch_size and grad_accum both set with --set.
  const auto from_cli = [&](const char* key) { return t.where(key).starts_with("--set"); };
  const bool has_g =
      t.given("global_batch_size") && !(has_m && has_a && !from_cli("global_batch_size") &&
                                        from_cli("micro_batch_size") && from_cli("grad_accum"));
  std::int64_t m = t.get_int("micro_batch_size"), a = t.get_int("grad_accum");
  s.parallel = resolve_parallel(config);
  const std::int64_t w = data_ranks(config, s.parallel, world);
  // A sequence split across ranks is one sequence of the batch.
  const std::string ranks_word = w == world ? "world" : "data ranks";
  if (has_g) {
    const std::int64_t g = t.get_int("global_batch_size");
    const std::string where = t.where("global_batch_size");
    if (has_m && has_a) {
      // Each factor fits an int; their product may not fit 64 bits.
      std::int64_t product = 0;
      const bool wraps =
          __builtin_mul_overflow(m, a, &product) || __builtin_mul_overflow(product, w, &product);
      if (wraps || product != g)
        throw ConfigError(where + ": [train] global_batch_size " + std::to_string(g) +
                          " contradicts micro_batch_size " + std::to_string(m) + " x grad_accum " +
                          std::to_string(a) + " x " + ranks_word + " " + std::to_string(w) +
                          (wraps ? std::string() : " = " + std::to_string(product)) +
                          "; give any two of the three");
    } else if (has_m) {
      a = derive(g, m * w, "micro_batch_size x " + ranks_word, where);
    } else if (has_a) {
      m = derive(g, a * w, "grad_accum x " + ranks_word, where);
    } else {
      a = 1;
      m = derive(g, w, w == world ? "the world size" : "the data ranks", where);
    }
  }
  tr.micro_batch = m;
  tr.grad_accum = a;
  tr.global_batch = m * a * w;
  refuse_with_parts(t, tr, s.parallel);
  // The data's position counts sequences in 64 bits: steps x global batch
  // must fit (integers never wrap).
  if (std::int64_t sequences = 0; __builtin_mul_overflow(tr.steps, tr.global_batch, &sequences))
    throw ConfigError(t.where("steps") + ": [train] steps = " + std::to_string(tr.steps) +
                      " at a global batch of " + std::to_string(tr.global_batch) +
                      " sequences passes the 64-bit count of sequences; at most " +
                      std::to_string(INT64_MAX / tr.global_batch) + " steps at this batch");

  const Options d = config.validate("device", device_options());
  s.device = resolve_device(d);
  s.comm = resolve_comm(config);
  if (s.comm.backend == "nccl" && s.device.kind != "cuda")
    throw ConfigError(config.where("comm.backend") +
                      ": [comm] backend \"nccl\" moves GPU memory, but the run is on [device] "
                      "kind \"" +
                      s.device.kind + "\"; set kind = \"cuda\" or backend = \"auto\"");
  return s;
}

namespace {

// The pipeline's keys: a partition method that exists, and chunks only
// where a built-in schedule interleaves (the schedule, built in or a
// plugin's, refuses the shapes it cannot run when the run is made).
void resolve_pipeline(const Options& p, ParallelSettings& s) {
  s.pipeline_schedule = p.get_string("pipeline_schedule");
  s.pipeline_chunks = static_cast<int>(p.get_int("pipeline_chunks"));
  s.pipeline_partition = p.get_string("pipeline_partition");
  try {
    pipeline::partition_method(s.pipeline_partition);
  } catch (const ConfigError& e) {
    throw ConfigError(p.where("pipeline_partition") + ": " + e.what());
  }
  const bool builtin = pipeline::is_builtin_schedule(s.pipeline_schedule);
  if (s.pipeline_chunks > 1 && builtin && s.pipeline_schedule != "interleaved")
    throw ConfigError(p.where("pipeline_chunks") +
                      ": [parallel] pipeline_chunks = " + std::to_string(s.pipeline_chunks) +
                      " with pipeline_schedule \"" + s.pipeline_schedule +
                      "\": only the interleaved schedule runs several chunks a stage; set "
                      "pipeline_schedule = \"interleaved\" or pipeline_chunks = 1");
}

}  // namespace

// Data, sequence (Ulysses), context (ring attention), tensor and pipeline
// are built, alone or together; expert parallelism is still being built: a
// degree above 1 would train something else than it says, so it is refused
// by name.
ParallelSettings resolve_parallel(const RunConfig& config) {
  const Options p = config.validate("parallel", parallel_options());
  if (const std::int64_t degree = p.get_int("expert"); degree > 1)
    throw ConfigError(p.where("expert") + ": [parallel] expert = " + std::to_string(degree) +
                      ": expert parallelism is not built in this version of ztrain; remove it "
                      "to train data-parallel over every rank ([strategy] still shards the "
                      "model's state, activation checkpointing and [parallel] sequence and "
                      "context save activation memory)");
  const auto degree = [&](const char* key) { return static_cast<int>(p.get_int(key)); };
  ParallelSettings s{degree("tensor"), degree("sequence"), degree("context"), degree("pipeline"),
                     degree("expert")};
  s.tensor_sequence = p.get_bool("tensor_sequence");
  resolve_pipeline(p, s);
  if (s.tensor_sequence && s.tensor == 1)
    throw ConfigError(p.where("tensor_sequence") +
                      ": [parallel] tensor_sequence splits the tokens over the tensor group, and "
                      "tensor = 1 makes none; set tensor above 1, or remove tensor_sequence");
  if (s.tensor_sequence && s.split().shards() > 1)
    throw ConfigError(p.where("tensor_sequence") + ": [parallel] tensor_sequence with [parallel] " +
                      s.split_key() + " = " +
                      std::to_string(s.split_key() == "context" ? s.context : s.sequence) +
                      ": Megatron's sequence parallelism inside a tensor group split "
                      "sequence is not built; use one or the other");
  return s;
}

std::filesystem::path resolve_out_dir(const RunConfig& config) {
  return config.validate("train", train_options()).get_string("out_dir");
}

CommSettings resolve_comm(const RunConfig& config) {
  const Options c = config.validate("comm", comm_options());
  CommSettings s{c.get_string("backend"), c.get_duration("timeout"), c.get_bool("shared_memory")};
  if (s.backend == "tcp")
    throw ConfigError(c.where("backend") +
                      ": [comm] backend \"tcp\" (ztrain's own socket rings) was replaced by "
                      "\"gloo\", which torchrun-style launches now run on; write backend = "
                      "\"gloo\" or \"auto\"");
  return s;
}

}  // namespace ztrain
