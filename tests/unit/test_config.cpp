// Run-file validation: every bad value fails with file:line:col, the key
// and what is expected; presets and --set overrides; the batch identity;
// the memory check's warning past what other processes leave free.
#include <doctest/doctest.h>

#include <fstream>

#include "config/run_settings.h"
#include "job/memory_check.h"
#include "loader/cuda_loader.h"
#include "support.h"

using namespace ztrain;

namespace {

std::string config_error(const std::string& toml) {
  return test::message_of<ConfigError>([&] {
    const RunConfig cfg = RunConfig::parse(toml, "run.toml");
    cfg.check_sections(run_file_sections());
    resolve_settings(cfg, 1);
  });
}

bool contains(const std::string& s, const std::string& part) {
  INFO("message: " << s);
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("unknown keys name the place and suggest the right one") {
  const std::string msg = config_error("[train]\nsteps = 3\nlearning_rate = 1e-3\nstepz = 3\n");
  CHECK(contains(msg, "run.toml:3:1: [train] learning_rate: unknown key"));
  CHECK(contains(msg, "known keys: steps"));
  CHECK(contains(config_error("[train]\nstepz = 3\n"), "did you mean 'steps'?"));
  CHECK(contains(config_error("[trian]\nsteps = 3\n"),
                 "run.toml:1:2: unknown section or key 'trian'; did you mean 'train'?"));
  CHECK(contains(config_error("[train.fp16]\nloss_scal = 0\n"),
                 "[train] fp16.loss_scal: unknown key; did you mean 'fp16.loss_scale'?"));
}

TEST_CASE("DeepSpeed's stage3_ spellings point to ztrain's option names") {
  const std::string msg = test::message_of<ConfigError>([] {
    const RunConfig cfg =
        RunConfig::parse("[strategy]\nstage3_max_live_parameters = 1e9\n", "run.toml");
    OptionList o;
    o.integer("max_live_parameters", 1000000000, "most elements gathered at once");
    cfg.validate("strategy", o);
  });
  CHECK(contains(msg,
                 "run.toml:2:1: [strategy] stage3_max_live_parameters: unknown key; did you "
                 "mean 'max_live_parameters'? (ztrain drops DeepSpeed's stage3_ prefix)"));
}

TEST_CASE("an integer option with keywords takes the word or a whole number, nothing else") {
  OptionList o;
  o.integer("sub_group_size", 1000000000, "elements stepped at a time")
      .at_least(1)
      .one_of({"auto"});
  const auto options = [&](const std::string& value) {
    return RunConfig::parse("[strategy]\nsub_group_size = " + value + "\n", "run.toml")
        .validate("strategy", o);
  };
  CHECK(options("\"auto\"").keyword("sub_group_size") == "auto");
  const Options number = options("2e6");
  CHECK(!number.keyword("sub_group_size"));
  CHECK(number.get_int("sub_group_size") == 2000000);
  for (const std::string bad : {"\"autox\"", "0", "2.5"}) {
    const std::string msg = test::message_of<ConfigError>([&] { options(bad); });
    CHECK(contains(msg, "run.toml:2:1: [strategy] sub_group_size: got "));
    CHECK(contains(msg, "expected an integer >= 1, or \"auto\""));
  }
}

TEST_CASE("a run past what other processes leave free is warned of, with both figures") {
  const std::uint64_t gib = std::uint64_t{1} << 30;
  CHECK(memory_warning(20 * gib, 21 * gib, 1).empty());
  CHECK(memory_warning(20 * gib, 0, 1).empty());  // unknown: nothing to say
  const std::string w = memory_warning(21 * gib, 19 * gib, 2);
  CHECK(contains(w, "warning: this run needs about 21.00 GiB of memory on this machine (2 ranks"));
  CHECK(contains(w, "more than the 19.00 GiB other processes leave free now (MemAvailable)"));
}

TEST_CASE("an unset min_lr follows lr, so lr = 0 alone is a valid run") {
  auto min_lr = [](const std::string& toml) {
    const auto s = resolve_settings(RunConfig::parse(toml, "run.toml"), 1).train.schedule;
    return std::get<NanoGptSchedule>(s).min_lr;
  };
  CHECK(min_lr("[train]\nlr = 0\n") == 0);
  CHECK(min_lr("[train]\nlr = 1e-3\n") == doctest::Approx(1e-4));
  CHECK(min_lr("") == doctest::Approx(3e-4));
  CHECK(min_lr("[train]\nlr = 1e-3\nmin_lr = 0\n") == 0);
}

TEST_CASE("wrong types and out-of-range values say what is expected") {
  CHECK(contains(config_error("[train]\nsteps = \"ten\"\n"),
                 "run.toml:2:1: [train] steps: got \"ten\", expected an integer >= 1"));
  CHECK(contains(config_error("[train]\nsteps = 0\n"), "expected an integer >= 1"));
  CHECK(contains(config_error("[train]\nsteps = 2.5\n"), "got 2.5, expected an integer"));
  CHECK(
      contains(config_error("[train]\nschedule = \"cosin\"\n"),
               "expected a string: one of \"cosine\", \"linear\", \"constant\", \"hf_linear\", "
               "\"hf_cosine\", \"hf_constant\", \"hf_constant_with_warmup\", \"WarmupLR\", "
               "\"WarmupDecayLR\", \"WarmupCosineLR\", \"OneCycle\", \"LRRangeTest\"; did you mean "
               "'cosine'?"));
  CHECK(contains(config_error("[train]\nbetas = [0.9]\n"), "expected two numbers"));
  CHECK(contains(config_error("[train]\nbetas = [0.9, 1.5]\n"), "betas: got [0.9, 1.5]"));
  CHECK(contains(config_error("[device]\nmemory_limit = \"lots\"\n"),
                 "run.toml:2:1: [device] memory_limit: 'lots' is not a size"));
  CHECK(contains(config_error("[comm]\ntimeout = \"soon\"\n"), "is not a duration"));
  // The tcp backend's rings were replaced by gloo: say so, not "unknown".
  CHECK(contains(config_error("[comm]\nbackend = \"tcp\"\n"),
                 "run.toml:2:1: [comm] backend \"tcp\" (ztrain's own socket rings) was replaced by "
                 "\"gloo\""));
  CHECK_NOTHROW(resolve_settings(RunConfig::parse("[comm]\nbackend = \"gloo\"\n", "run.toml"), 1));
  CHECK(
      contains(config_error("[train]\nmin_lr = 1.0\nlr = 0.1\n"), "min_lr (1.000000) is above lr"));
  CHECK(contains(config_error("train = 3\n"), "'train' must be a table"));
  CHECK(contains(config_error("[train]\nprecision = \"bf16\"\ngrad_accum_dtype = \"fp16\"\n"),
                 "run.toml:3:"));
  CHECK(contains(config_error("[train]\nprecision = \"fp16\"\ngrad_accum_dtype = \"bf16\"\n"),
                 "use \"fp32\" or \"fp16\""));
  CHECK(
      contains(config_error("[train]\ngrad_accum_dtype = \"fp8\"\n"), "unknown precision \"fp8\""));
}

TEST_CASE("TOML syntax errors carry file:line:col") {
  CHECK(contains(config_error("[train]\nsteps = = 3\n"), "run.toml:2:"));
}

TEST_CASE("sizes accept strings with units and plain numbers") {
  const RunConfig cfg = RunConfig::parse("[device]\nmemory_limit = \"2GiB\"\n", "run.toml");
  CHECK(resolve_settings(cfg, 1).device.memory_limit == 2147483648ull);
  const RunConfig cfg2 = RunConfig::parse("[device]\nmemory_limit = 5e8\n", "run.toml");
  CHECK(resolve_settings(cfg2, 1).device.memory_limit == 500000000ull);
}

TEST_CASE("--set overrides keep their type, create tables and name themselves in errors") {
  RunConfig cfg = RunConfig::parse("[train]\nsteps = 3\n", "run.toml");
  cfg.override_with("train.steps=20");
  cfg.override_with("train.betas=[0.8, 0.9]");
  cfg.override_with("train.out_dir=runs/x y");
  cfg.override_with("device.memory_limit=1GiB");
  const RunSettings s = resolve_settings(cfg, 1);
  CHECK(s.train.steps == 20);
  CHECK(s.train.optimizer.beta1 == doctest::Approx(0.8));
  CHECK(s.train.out_dir == "runs/x y");
  CHECK(s.device.memory_limit == 1073741824ull);
  cfg.override_with("train.steps=-1");
  CHECK(contains(test::message_of<ConfigError>([&] { resolve_settings(cfg, 1); }),
                 "--set train.steps=-1: [train] steps: got -1"));
  CHECK_THROWS_AS(cfg.override_with("steps=3"), ConfigError);
  CHECK_THROWS_AS(cfg.override_with("train.steps"), ConfigError);
  CHECK_THROWS_AS(cfg.override_with("train.steps.x=1"), ConfigError);
}

TEST_CASE("--strategy replaces [strategy] with the preset, or names the plugin") {
  test::TempDir dir;
  std::filesystem::create_directories(dir / "strategies");
  std::ofstream(dir / "strategies" / "mine.toml") << "[strategy]\nplugin = \"ddp\"\n";
  std::ofstream(dir / "strategies" / "bad.toml") << "[train]\nsteps = 1\n";
  std::ofstream(dir / "run.toml") << "[strategy]\nplugin = \"other\"\nkey = 1\n";
  RunConfig cfg = RunConfig::load(dir / "run.toml", "", "mine", {}, {dir.path()});
  CHECK(cfg.plugin("strategy", "") == "ddp");
  CHECK_FALSE(cfg.table().at_path("strategy.key"));
  CHECK(cfg.where("strategy.plugin").find("mine.toml:2:1") != std::string::npos);
  RunConfig named = RunConfig::load(dir / "run.toml", "", "zero9", {}, {dir.path()});
  CHECK(named.plugin("strategy", "") == "zero9");
  CHECK(named.where("strategy.plugin") == "--strategy zero9");
  CHECK(contains(test::message_of<ConfigError>(
                     [&] { RunConfig::load(dir / "run.toml", "", "bad", {}, {dir.path()}); }),
                 "may only hold a [strategy] table"));
  CHECK(contains(
      test::message_of<ConfigError>([&] { RunConfig::load(dir / "missing.toml", "", "", {}, {}); }),
      "cannot read run file"));
}

// --model replaces [model]: a fine-tuning method set there is refused
// rather than dropped (the run would train the whole model, unsaid);
// "full" and the architecture's keys go as documented.
TEST_CASE("--model refuses to drop the run file's fine-tuning keys") {
  test::TempDir dir;
  std::filesystem::create_directories(dir / "models");
  std::ofstream(dir / "models" / "tiny.toml") << "[model]\nplugin = \"transformer\"\nn_layer = 1\n";
  for (const std::string key :
       {"finetuning_type = \"lora\"", "lora_rank = 4", "freeze_trainable_layers = 1",
        "adapter_from = \"a\"", "use_rslora = true"}) {
    CAPTURE(key);
    std::ofstream(dir / "run.toml") << "[model]\nn_layer = 9\n" << key << "\n";
    CHECK(contains(test::message_of<ConfigError>(
                       [&] { RunConfig::load(dir / "run.toml", "tiny", "", {}, {dir.path()}); }),
                   "run.toml:3:1: [model] " + key.substr(0, key.find(' ')) +
                       " would be dropped, as --model tiny replaces [model]"));
  }
  std::ofstream(dir / "run.toml") << "[model]\nn_layer = 9\nfinetuning_type = \"full\"\n";
  const RunConfig cfg = RunConfig::load(dir / "run.toml", "tiny", "", {}, {dir.path()});
  CHECK(cfg.table().at_path("model.n_layer").value<std::int64_t>() == 1);
}

TEST_CASE("batch identity: any two of micro, accumulation and global, and contradictions fail") {
  auto settle = [](const std::string& toml, int world) {
    return resolve_settings(RunConfig::parse(toml, "run.toml"), world).train;
  };
  auto t = settle("[train]\nglobal_batch_size = 32\nmicro_batch_size = 4\n", 2);
  CHECK(t.grad_accum == 4);
  t = settle("[train]\nglobal_batch_size = 32\ngrad_accum = 2\n", 4);
  CHECK(t.micro_batch == 4);
  t = settle("[train]\nglobal_batch_size = 32\n", 4);
  CHECK(t.micro_batch == 8);
  CHECK(t.grad_accum == 1);
  t = settle("[train]\nmicro_batch_size = 3\ngrad_accum = 5\n", 2);
  CHECK(t.global_batch == 30);
  CHECK(contains(
      config_error("[train]\nglobal_batch_size = 30\nmicro_batch_size = 4\ngrad_accum = 2\n"),
      "contradicts micro_batch_size 4 x grad_accum 2 x world 1 = 8"));
  CHECK(contains(config_error("[train]\nglobal_batch_size = 30\nmicro_batch_size = 4\n"),
                 "not divisible by micro_batch_size x world (4)"));
}

// The mesh's dimensions but data and sequence are being built (issue 51):
// a degree above 1 is refused naming its key and place, never run as data
// parallelism. The batch counts the data ranks, what the others leave.
TEST_CASE(
    "parallel section: degrees of 1 are the data-parallel run, sequence, context, tensor and "
    "pipeline split the world, the unbuilt are refused by name") {
  const auto settings = [](const std::string& toml, int world) {
    return resolve_settings(RunConfig::parse(toml, "run.toml"), world);
  };
  const ParallelSettings ones = settings("[parallel]\ntensor = 1\nsequence = 1\n", 1).parallel;
  CHECK(ones.tensor == 1);
  CHECK(ones.sequence == 1);
  CHECK(settings("", 1).parallel.pipeline == 1);
  // 4 ranks in sequence groups of 2: 2 data ranks carry the batch.
  const RunSettings s2 = settings(
      "[parallel]\nsequence = 2\n[train]\nmicro_batch_size = 3\nglobal_batch_size = 12\n", 4);
  CHECK(s2.parallel.sequence == 2);
  CHECK(s2.parallel.model_ranks() == 2);
  CHECK(s2.train.grad_accum == 2);
  CHECK(contains(test::message_of<ConfigError>([&] {
                   settings(
                       "[parallel]\nsequence = 2\n[train]\nmicro_batch_size = 4\n"
                       "grad_accum = 1\nglobal_batch_size = 16\n",
                       4);
                 }),
                 "contradicts micro_batch_size 4 x grad_accum 1 x data ranks 2 = 8"));
  CHECK(contains(config_error("[parallel]\nsequence = 2\n"),
                 "run.toml:2:1: [parallel] tensor x sequence x context x pipeline = 2 ranks per "
                 "copy of the model do not divide the world of 1 rank; start a multiple of 2"));
  // Context (ring attention) splits the world as sequence does, and names
  // itself when the world does not divide.
  const RunSettings c2 = settings("[parallel]\ncontext = 2\n[train]\nglobal_batch_size = 8\n", 4);
  CHECK(c2.parallel.context == 2);
  CHECK(c2.parallel.split() == SequenceSplit{1, 2});
  CHECK(c2.parallel.split_key() == "context");
  CHECK(s2.parallel.split() == SequenceSplit{2, 1});
  CHECK(s2.parallel.split_key() == "sequence");
  // Both: a 2-D group of 4 ranks per copy of the model.
  const RunSettings sc =
      settings("[parallel]\nsequence = 2\ncontext = 2\n[train]\nglobal_batch_size = 4\n", 8);
  CHECK(sc.parallel.split().shards() == 4);
  CHECK(sc.parallel.model_ranks() == 4);
  CHECK(sc.train.grad_accum * sc.train.micro_batch * 2 == 4);
  CHECK(contains(config_error("[parallel]\ncontext = 4\n"),
                 "run.toml:2:1: [parallel] tensor x sequence x context x pipeline = 4 ranks per "
                 "copy of the model do not divide the world of 1 rank; start a multiple of 4 ranks "
                 "or lower the degrees (--set parallel.context=1"));
  CHECK(contains(config_error("[parallel]\nsequence = 2\ncontext = 2\n"),
                 "run.toml:3:1: [parallel] tensor x sequence x context x pipeline = 4 ranks per "
                 "copy of the model do not divide the world of 1 rank"));
  // Tensor splits the world as the sequence does (the data ranks carry the
  // batch), with it too; sampling from its parts is refused by its key.
  const RunSettings t2 =
      settings("[parallel]\ntensor = 2\n[train]\nsave_final = false\nglobal_batch_size = 8\n", 4);
  CHECK(t2.parallel.tensor == 2);
  CHECK(t2.parallel.model_ranks() == 2);
  CHECK(t2.train.micro_batch * t2.train.grad_accum * 2 == 8);
  CHECK(contains(config_error("[parallel]\ntensor = 2\n"),
                 "run.toml:2:1: [parallel] tensor x sequence x context x pipeline = 2 ranks per "
                 "copy of the model do not divide the world of 1 rank"));
  CHECK(contains(test::message_of<ConfigError>(
                     [&] { settings("[parallel]\ntensor = 2\n[train]\nsample_every = 5\n", 2); }),
                 "run.toml:4:1: [train] sample_every > 0 with [parallel] tensor = 2"));
  CHECK(settings("[parallel]\ntensor = 2\n[train]\ncheckpoint_every = 5\n", 2)
            .train.checkpoint_every == 5);
  CHECK(settings("[parallel]\ntensor = 2\nsequence = 2\n", 4).parallel.model_ranks() == 4);
  // Pipeline splits the world as the others do; its keys resolve, sampling
  // is refused by its key, chunks only with the interleaved schedule.
  const RunSettings p2 = settings(
      "[parallel]\npipeline = 2\npipeline_schedule = \"interleaved\"\npipeline_chunks = 2\n"
      "pipeline_partition = \"uniform\"\n[train]\nglobal_batch_size = 8\n",
      4);
  CHECK(p2.parallel.model_ranks() == 2);
  CHECK(p2.parallel.pipeline_schedule == "interleaved");
  CHECK(p2.parallel.pipeline_chunks == 2);
  CHECK(p2.parallel.pipeline_partition == "uniform");
  CHECK(settings("[parallel]\npipeline = 2\n", 2).parallel.pipeline_schedule == "1f1b");
  CHECK(contains(config_error("[parallel]\npipeline = 2\n"),
                 "(--set parallel.pipeline=1 runs every layer on every rank"));
  CHECK(contains(test::message_of<ConfigError>(
                     [&] { settings("[parallel]\npipeline = 2\n[train]\nsample_every = 5\n", 2); }),
                 "run.toml:4:1: [train] sample_every > 0 with [parallel] pipeline = 2"));
  CHECK(contains(test::message_of<ConfigError>(
                     [&] { settings("[parallel]\npipeline = 2\npipeline_chunks = 2\n", 2); }),
                 "run.toml:3:1: [parallel] pipeline_chunks = 2 with pipeline_schedule \"1f1b\""));
  CHECK(contains(test::message_of<ConfigError>([&] {
                   settings("[parallel]\npipeline = 2\npipeline_partition = \"type:x\"\n", 2);
                 }),
                 "run.toml:3:1: "));
  CHECK(contains(config_error("[parallel]\nexpert = 8\n"), "expert parallelism"));
  CHECK(contains(config_error("[parallel]\ntensor = 0\n"), "tensor"));
  CHECK(contains(config_error("[parallel]\ndata = 2\n"), "data"));
}

TEST_CASE("the shipped configs are valid") {
  for (const char* name : {"run.toml"}) {
    const RunConfig cfg = RunConfig::load(test::source_dir() / "configs" / name, "", "ddp", {},
                                          {test::source_dir() / "configs"});
    Run run = assemble(cfg, test::loader());
    CHECK(run.model->info().n_params > 0);
  }
  for (const auto& e :
       std::filesystem::directory_iterator(test::source_dir() / "configs" / "models")) {
    INFO(e.path());
    const RunConfig cfg =
        RunConfig::load(test::source_dir() / "configs" / "run.toml", e.path().stem().string(), "",
                        {}, {test::source_dir() / "configs"});
    const auto lib = test::loader().load("model", cfg.plugin("model", "transformer"));
    const auto model = lib.create<Model>(cfg.validate("model", lib.options(), {"plugin"}));
    CHECK(model->info().n_params > 0);
  }
}

TEST_CASE("a configuration sent by rank 0 arrives with every value, origin and note") {
  RunConfig sent = RunConfig::parse(
      "[train]\nlr = 6e-4\nmin_lr = 0.1\nbetas = [0.9, 0.95]\nout_dir = \"\\nruns/a'''b\"\n"
      "[model]\nn_layer = 2\nname = \"x\\\"y\\u00e9\"\n[strategy]\nplugin = \"zero3\"\n",
      "run.toml");
  sent.override_with("train.steps=20");
  sent.override_with("train.eps=1e-300");
  toml::table imported;
  imported.insert("grad_clip", 3.0000000000000004);
  sent.set_imported("train", imported, false, {{"train.grad_clip", "ds.json: gradient_clipping"}});
  sent.add_note("ds.json: train_batch_size: auto -> 8");
  const RunConfig got = RunConfig::from_wire(sent.to_wire());
  CHECK(got.table() == sent.table());
  CHECK(got.name() == sent.name());
  CHECK(got.notes() == sent.notes());
  for (const char* key :
       {"train.lr", "train.min_lr", "train.betas", "train.out_dir", "model.n_layer", "model.name",
        "strategy.plugin", "train.steps", "train.eps", "train.grad_clip"}) {
    INFO(key);
    CHECK(got.where(key) == sent.where(key));
  }
  CHECK(got.where("train.lr") == "run.toml:2:1");
  CHECK(got.where("train.steps") == "--set train.steps=20");
  CHECK(got.where("train.grad_clip") == "ds.json: gradient_clipping");
  CHECK(got.table().at_path("train.out_dir").value_or(std::string()) == "\nruns/a'''b");
  CHECK_THROWS_AS(RunConfig::from_wire("{\"name\": 1}"), ConfigError);
  CHECK_THROWS_AS(RunConfig::from_wire("not json"), ConfigError);
}

TEST_CASE("kind = auto takes a GPU only where every rank here gets one, cuda is kept for the run") {
  std::string why;
  const ztrain::cuda::Backend* backend = ztrain::cuda_backend(&why);
  const int gpus = backend ? backend->device_count(&why) : 0;
  auto settings = [](const std::string& toml) {
    return resolve_settings(RunConfig::parse(toml, "run.toml"), 1);
  };
  INFO(why);
  CHECK(settings("[device]\nkind = \"auto\"\n").device.kind ==
        (gpus >= 1 && backend->make_nccl ? "cuda" : "cpu"));
  // Checked when the run opens the device, so `estimate` works anywhere.
  const auto cuda = settings("[device]\nkind = \"cuda\"\n").device;
  CHECK(cuda.kind == "cuda");
  CHECK(cuda.kind_where == "run.toml:2:1");
  CHECK(settings("").device.kind == "cpu");
  CHECK_FALSE(settings("").device.tf32);
  CHECK(settings("").device.pin_memory);
  // nccl moves GPU memory: on the cpu it is a contradiction, named.
  CHECK(contains(config_error("[comm]\nbackend = \"nccl\"\n"),
                 "run.toml:2:1: [comm] backend \"nccl\" moves GPU memory, but the run is on "
                 "[device] kind \"cpu\""));
}

// [train] epochs: the steps that pass the training sequences that many
// times at the global batch, rounded up, and a schedule over them; with
// steps also given the command line's key wins, two of the same standing
// are refused; an endless source has no epochs.
TEST_CASE("epochs become steps once the data's size is known") {
  RunConfig cfg = RunConfig::parse("[train]\nepochs = 2.5\nglobal_batch_size = 4\n", "run.toml");
  RunSettings s = resolve_settings(cfg, 1);
  CHECK(s.train.epochs == 2.5);
  const std::string note = steps_from_epochs(s, cfg, 10);
  CHECK(s.train.steps == 7);  // ceil(2.5 x 10 / 4)
  CHECK(std::get<NanoGptSchedule>(s.train.schedule).total == 7);
  CHECK(contains(note, "steps: 7, for epochs = 2.5 (run.toml:2:1) of 10 training sequences at 4"));
  CHECK(contains(test::message_of<ConfigError>([&] { steps_from_epochs(s, cfg, std::nullopt); }),
                 "run.toml:2:1: [train] epochs counts passes over the training data, and this "
                 "source is endless; give steps instead"));
  RunConfig both = RunConfig::parse("[train]\nepochs = 1\nsteps = 9\n", "run.toml");
  CHECK(
      contains(test::message_of<ConfigError>([&] { resolve_settings(both, 1); }),
               "run.toml:2:1: [train] epochs and steps (run.toml:3:1) both say how long to train"));
  both.override_with("train.epochs=3");
  CHECK(resolve_settings(both, 1).train.epochs == 3);
  RunConfig steps_wins = RunConfig::parse("[train]\nepochs = 1\n", "run.toml");
  steps_wins.override_with("train.steps=9");
  CHECK(resolve_settings(steps_wins, 1).train.epochs == 0);
  CHECK(resolve_settings(steps_wins, 1).train.steps == 9);
}

// epoch_steps = "transformers": the Trainer's count (transformers 5.25's
// set_initial_training_values): each rank's ceil(N / world) sequences in
// ceil(. / micro) batches, ceil(. / accumulation) steps an epoch, times
// the epochs rounded up. 10 sequences, 3 epochs, micro 1 x accumulation 4:
// 3 steps an epoch, 9 in all, where ztrain's own count is ceil(30 / 4) = 8;
// at world 2 x accumulation 2 each rank's 5 give 3 an epoch again.
TEST_CASE("epochs count steps as transformers' Trainer counts them where asked") {
  const auto steps = [](const std::string& toml, int world) {
    RunConfig cfg = RunConfig::parse(toml, "run.toml");
    RunSettings s = resolve_settings(cfg, world);
    const std::string note = steps_from_epochs(s, cfg, 10);
    return std::pair{s.train.steps, note};
  };
  const std::string keys = "[train]\nepochs = 3\nmicro_batch_size = 1\n";
  CHECK(steps(keys + "grad_accum = 4\n", 1).first == 8);
  const auto [trainer, note] = steps(keys + "grad_accum = 4\nepoch_steps = \"transformers\"\n", 1);
  CHECK(trainer == 9);
  CHECK(contains(note, "counted as transformers' Trainer counts them"));
  CHECK(steps(keys + "grad_accum = 2\nepoch_steps = \"transformers\"\n", 2).first == 9);
  CHECK(steps("[train]\nepochs = 0.5\nmicro_batch_size = 1\ngrad_accum = 4\n"
              "epoch_steps = \"transformers\"\n",
              1)
            .first == 2);  // ceil(0.5 x 3)
}

// A names option takes one name, a list, or names separated by commas in
// one string (LLaMA-Factory's "q_proj, v_proj"), blanks trimmed; an empty
// name anywhere is refused, naming the key. A files option keeps its
// strings whole.
TEST_CASE("names options split comma-separated strings, files options do not") {
  OptionList spec;
  spec.names("target", "the modules");
  spec.files("files", "the files");
  const auto options = [&](const std::string& toml) {
    return RunConfig::parse("[x]\n" + toml, "run.toml").validate("x", spec);
  };
  CHECK(options("target = \"q_proj, v_proj\"\n").get_names("target") ==
        std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(options("target = [\"a,b\", \"c\"]\n").get_names("target") ==
        std::vector<std::string>{"a", "b", "c"});
  CHECK(options("files = \"a,b.txt\"\n").get_files("files").size() == 1);
  CHECK(contains(test::message_of<ConfigError>([&] { options("target = \"a,,b\"\n"); }),
                 "run.toml:2:1: [x] target: an empty name; the modules"));
}
