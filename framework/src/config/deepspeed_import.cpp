// The mapping, section by section. Each DeepSpeed object is walked by a
// Section that hands out its keys by name and, at the end, refuses the
// keys no one asked for, so a key is either mapped, warned about (it has
// no effect here, and the warning says why) or an error; nothing is
// dropped in silence. Numbers are taken in the type ztrain declares:
// DeepSpeed writes sizes as 1e9, which must be an integer exactly.
#include "config/deepspeed_import.h"

#include "config/lr_schedule.h"
#include "config/run_settings.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "ztrain/error.h"

namespace ztrain {
namespace {

using nlohmann::json;

// One JSON object of the config, with the path that names its keys.
class Section {
 public:
  Section(const json* obj, std::string path, std::string file)
      : obj_(obj), path_(std::move(path)), file_(std::move(file)) {
    if (obj_ && !obj_->is_object())
      throw ConfigError(where("") + " is " + obj_->dump() + "; expected an object ({...})");
  }

  std::string where(const std::string& key) const {
    return file_ + ": " + (path_.empty() ? key : key.empty() ? path_ : path_ + "." + key);
  }
  // The value of `key` (marked as read), or nullptr.
  const json* get(const std::string& key) {
    used_.insert(key);
    if (!obj_) return nullptr;
    const auto it = obj_->find(key);
    return it == obj_->end() || it->is_null() ? nullptr : &*it;
  }
  bool is_auto(const json* v) const { return v && v->is_string() && *v == "auto"; }
  Section sub(const std::string& key) { return Section(get(key), path_key(key), file_); }

  std::int64_t integer(const json& v, const std::string& key) const {
    if (v.is_number_integer()) return v.get<std::int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::floor(d) == d && std::fabs(d) < 9.2e18) return static_cast<std::int64_t>(d);
    }
    throw ConfigError(where(key) + " is " + v.dump() + "; expected an integer");
  }
  double number(const json& v, const std::string& key) const {
    if (v.is_number()) return v.get<double>();
    throw ConfigError(where(key) + " is " + v.dump() + "; expected a number");
  }
  bool boolean(const json& v, const std::string& key) const {
    if (v.is_boolean()) return v.get<bool>();
    throw ConfigError(where(key) + " is " + v.dump() + "; expected true or false");
  }
  std::string string(const json& v, const std::string& key) const {
    if (v.is_string()) return v.get<std::string>();
    throw ConfigError(where(key) + " is " + v.dump() + "; expected a string");
  }

  // Keys that have no effect here: read, with the reason for the warning.
  void no_effect(const std::map<std::string, std::string>& keys, std::vector<std::string>& out) {
    for (const auto& [key, why] : keys)
      if (get(key)) out.push_back(where(key) + " has no effect in ztrain: " + why);
  }
  // Every key no one read is an error.
  void finish() const {
    if (!obj_) return;
    for (const auto& [key, value] : obj_->items())
      if (!used_.count(key))
        throw ConfigError(where(key) +
                          " is not a DeepSpeed key ztrain knows (or not one it "
                          "supports); remove it or see `ztrain convert-deepspeed`");
  }

 private:
  std::string path_key(const std::string& key) const {
    return path_.empty() ? key : path_ + "." + key;
  }
  const json* obj_;
  std::string path_, file_;
  std::set<std::string> used_;
};

// Where values go, with their origins.
struct Builder {
  ImportedConfig& out;
  template <class V>
  void train(const std::string& key, V&& value, const std::string& origin) {
    put(out.train, "train." + key, key, std::forward<V>(value), origin);
  }
  template <class V>
  void strategy(const std::string& key, V&& value, const std::string& origin) {
    put(out.strategy, "strategy." + key, key, std::forward<V>(value), origin);
  }
  template <class V>
  void parallel(const std::string& key, V&& value, const std::string& origin) {
    put(out.parallel, "parallel." + key, key, std::forward<V>(value), origin);
  }

 private:
  // `key` may be one level dotted ("fp16.hysteresis", "aio.block_size").
  template <class V>
  void put(toml::table& t, const std::string& path, const std::string& key, V&& value,
           const std::string& origin) {
    const auto dot = key.find('.');
    toml::table* into = &t;
    if (dot != std::string::npos) {
      into = t.get_as<toml::table>(key.substr(0, dot));
      if (!into)
        into = t.insert_or_assign(key.substr(0, dot), toml::table{}).first->second.as_table();
    }
    into->insert_or_assign(dot == std::string::npos ? key : key.substr(dot + 1),
                           std::forward<V>(value));
    out.origins[path] = origin;
  }
};

// A run key's value as the run has it, or nullptr.
const toml::node* run_value(const RunConfig& run, const std::string& path) {
  return run.table().at_path(path).node();
}

// A value as a note says it: strings bare, numbers shortest.
std::string note_text(const toml::node& n) {
  if (const auto* str = n.as_string()) return str->get();
  return toml_value_text(n);
}

// A value of a table at a dotted path as a note says it, or fallback.
std::string table_text(const toml::table& t, const std::string& path, const std::string& fallback) {
  const toml::node* n = t.at_path(path).node();
  return n ? note_text(*n) : fallback;
}

std::string run_text(const RunConfig& run, const std::string& path, const std::string& fallback) {
  return table_text(run.table(), path, fallback);
}

// A [train] key's value as the run has it, else its default as [train]'s
// options declare it: what an "auto" became, said in the note.
std::string run_or_default(const RunConfig& run, const std::string& key) {
  if (const toml::node* n = run_value(run, "train." + key)) return note_text(*n);
  if (key == "global_batch_size") return "its default: micro_batch_size x grad_accum x ranks";
  static const OptionList train = train_options();
  const OptionSpec* spec = train.find(key);
  return spec ? "its default, " + option_value_text(spec->default_value) : "its default";
}

// The batch keys and gradient clipping: numbers set the run's keys, "auto"
// keeps them.
void map_batch(Section& top, const RunConfig& run, Builder& b) {
  const struct {
    const char* ds;
    const char* key;
  } batch[] = {{"train_batch_size", "global_batch_size"},
               {"train_micro_batch_size_per_gpu", "micro_batch_size"},
               {"gradient_accumulation_steps", "grad_accum"}};
  bool numbers = false, autos = false;
  for (const auto& k : batch) {
    const json* v = top.get(k.ds);
    if (!v) continue;
    if (top.is_auto(v)) {
      autos = true;
      b.out.notes.push_back(top.where(k.ds) + ": auto -> the run's train." + k.key + " (" +
                            run_or_default(run, k.key) + ")");
      continue;
    }
    const std::int64_t n = top.integer(*v, k.ds);
    if (n < 1) throw ConfigError(top.where(k.ds) + " is " + std::to_string(n) + "; give 1 or more");
    b.train(k.key, toml::value<std::int64_t>(n), top.where(k.ds));
    numbers = true;
  }
  // A file that gives the batch in numbers gives all of it, as DeepSpeed
  // derives the keys it leaves out from those it gives (train_batch_size
  // alone: accumulation 1); the run's own values of those keys would change
  // the batch, so they leave the run. A file with an "auto" batch key asks
  // for the run's batch (the Trainer fills it from its arguments): nothing
  // leaves then.
  for (const auto& k : batch) {
    const std::string path = std::string("train.") + k.key;
    if (!numbers || autos || top.get(k.ds) || !run_value(run, path)) continue;
    b.out.superseded.push_back(path);
    b.out.notes.push_back(run.where(path) + ": " + path + " = " + run_text(run, path, "") +
                          " is dropped: " + top.where(k.ds) +
                          " is absent, and DeepSpeed derives it from the batch keys given");
  }
  if (const json* v = top.get("gradient_clipping")) {
    if (top.is_auto(v))
      b.out.notes.push_back(top.where("gradient_clipping") +
                            ": auto -> the run's train.grad_clip (" +
                            run_or_default(run, "grad_clip") + ")");
    else
      b.train("grad_clip", toml::value<double>(top.number(*v, "gradient_clipping")),
              top.where("gradient_clipping"));
  }
  // DeepSpeed's steps_per_print paces what it prints; metrics.jsonl keeps
  // the run's log_every.
  if (const json* v = top.get("steps_per_print"); v && !top.is_auto(v)) {
    const std::int64_t n = top.integer(*v, "steps_per_print");
    if (n < 1)
      throw ConfigError(top.where("steps_per_print") + " is " + std::to_string(n) +
                        "; give 1 or more");
    b.train("print_every", toml::value<std::int64_t>(n), top.where("steps_per_print"));
  }
}

// "enabled": true, false, or "auto" (nullopt).
std::optional<bool> enabled(Section& s) {
  const json* v = s.get("enabled");
  if (!v || s.is_auto(v)) return std::nullopt;
  return s.boolean(*v, "enabled");
}

void map_precision(Section& top, const RunConfig& run, Builder& b) {
  Section fp16 = top.sub("fp16"), bf16 = top.sub("bf16");
  const std::optional<bool> f = enabled(fp16), h = enabled(bf16);
  const std::string precision = run_text(run, "train.precision", "fp32");
  if (f.value_or(false) && h.value_or(false))
    throw ConfigError(fp16.where("enabled") + " and " + bf16.where("enabled") +
                      " are both true; enable one of them");
  if (f.value_or(false))
    b.train("precision", toml::value<std::string>("fp16"), fp16.where("enabled"));
  else if (h.value_or(false))
    b.train("precision", toml::value<std::string>("bf16"), bf16.where("enabled"));
  else if ((f == false && precision == "fp16") || (h == false && precision == "bf16"))
    b.train("precision", toml::value<std::string>("fp32"),
            (f == false ? fp16 : bf16).where("enabled"));
  else if (!f || !h)
    b.out.notes.push_back(top.where("fp16/bf16.enabled") + ": auto -> the run's train.precision (" +
                          precision + ")");
  for (const char* key : {"loss_scale", "min_loss_scale"})
    if (const json* v = fp16.get(key))
      b.train(std::string("fp16.") + key, toml::value<double>(fp16.number(*v, key)),
              fp16.where(key));
  for (const char* key : {"initial_scale_power", "loss_scale_window", "hysteresis"})
    if (const json* v = fp16.get(key))
      b.train(std::string("fp16.") + key, toml::value<std::int64_t>(fp16.integer(*v, key)),
              fp16.where(key));
  if (const json* v = fp16.get("consecutive_hysteresis"))
    b.train("fp16.consecutive_hysteresis",
            toml::value<bool>(fp16.boolean(*v, "consecutive_hysteresis")),
            fp16.where("consecutive_hysteresis"));
  fp16.no_effect({{"auto_cast", "inputs are never cast; the model computes in the run's precision"},
                  {"fp16_master_weights_and_grads", "master weights are always fp32"}},
                 b.out.warnings);
  bf16.no_effect({{"immediate_grad_update", "gradients are applied once per step"}},
                 b.out.warnings);
  fp16.finish();
  bf16.finish();
}

// The scheduler that sets the lr itself, leaving the optimizer's unread
// (WarmupLR reads it only without warmup_max_lr; WarmupCosineLR scales it).
std::optional<std::string> lr_set_by_scheduler(const json& top) {
  const auto sched = top.find("scheduler");
  if (sched == top.end() || !sched->is_object()) return std::nullopt;
  const auto type = sched->find("type");
  if (type == sched->end() || !type->is_string()) return std::nullopt;
  const std::string name = type->get<std::string>();
  if (name == "WarmupCosineLR") return std::nullopt;
  if (name == "WarmupLR") {
    const auto params = sched->find("params");
    if (params == sched->end() || !params->is_object() || !params->contains("warmup_max_lr") ||
        (*params)["warmup_max_lr"].is_null())
      return std::nullopt;
  }
  return name;
}

// The optimizer's parameters DeepSpeed fills when a file leaves them out:
// FusedAdam's and DeepSpeedCPUAdam's defaults (lr 1e-3, betas (0.9, 0.999),
// eps 1e-8, weight_decay 0), torch.optim.AdamW's weight_decay 0.01 under
// "torch_adam". Not the run's own defaults, which differ.
void fill_optimizer_defaults(Section& params, Builder& b, bool torch_adamw, bool lr_read) {
  const auto absent = [&](const char* key) { return !params.get(key); };
  const auto said = [&](const char* key, const std::string& value) {
    b.out.notes.push_back(params.where(key) + ": absent -> " + value + ", DeepSpeed's default");
  };
  if (lr_read && absent("lr")) {
    b.train("lr", toml::value<double>(1e-3), params.where("lr"));
    said("lr", "0.001");
  }
  if (absent("betas")) {
    b.train("betas", toml::array{0.9, 0.999}, params.where("betas"));
    said("betas", "[0.9, 0.999]");
  }
  if (absent("eps")) {
    b.train("eps", toml::value<double>(1e-8), params.where("eps"));
    said("eps", "1e-08");
  }
  if (absent("weight_decay")) {
    b.train("weight_decay", toml::value<double>(torch_adamw ? 0.01 : 0.0),
            params.where("weight_decay"));
    said("weight_decay", torch_adamw ? "0.01 (torch.optim.AdamW's)" : "0");
  }
}

// DeepSpeed's Adam decouples weight decay unless adam_w_mode is false
// (then it adds weight_decay * p to the gradient: FusedAdam's and
// DeepSpeedCPUAdam's L2 mode, torch.optim.Adam under torch_adam); AdamW
// always decouples, whatever adam_w_mode says. The file's mode replaces
// the run's either way.
bool decoupled(Section& opt, Section& params, Builder& b) {
  const json* t = opt.get("type");
  const bool adamw = t && (*t == "AdamW" || *t == "adamw");
  const json* mode = params.get("adam_w_mode");
  const bool decoupled = adamw || !mode || params.boolean(*mode, "adam_w_mode");
  b.train("weight_decay_mode", toml::value<std::string>(decoupled ? "decoupled" : "l2"),
          params.where("adam_w_mode"));
  if (adamw && mode && !params.boolean(*mode, "adam_w_mode"))
    b.out.warnings.push_back(params.where("adam_w_mode") +
                             " has no effect: type AdamW decouples weight decay in DeepSpeed "
                             "whatever adam_w_mode says, here too");
  return decoupled;
}

// AdamW's parameters ("auto": the run's; absent: DeepSpeed's defaults).
// Without an optimizer section the run's AdamW applies, as the Hugging Face
// Trainer applies its own.
void map_optimizer(Section& top, const RunConfig& run, Builder& b,
                   const std::optional<std::string>& lr_set_by) {
  if (!top.get("optimizer")) {
    b.out.notes.push_back(top.where("optimizer") +
                          ": none -> the run's AdamW ([train] lr, betas, eps, weight_decay)");
    return;
  }
  Section opt = top.sub("optimizer");
  if (const json* t = opt.get("type")) {
    const std::string type = opt.string(*t, "type");
    if (type != "Adam" && type != "AdamW" && type != "adam" && type != "adamw")
      throw ConfigError(opt.where("type") + " is \"" + type +
                        "\"; ztrain's optimizer is AdamW: use \"AdamW\" (or \"Adam\")");
  } else {
    throw ConfigError(opt.where("type") + " is missing; DeepSpeed needs the optimizer's type");
  }
  Section params = opt.sub("params");
  // "auto" keeps the run's value, as the Hugging Face Trainer fills it from
  // its own arguments; the note says which.
  for (const char* key : {"lr", "betas", "eps", "weight_decay"})
    if (const json* v = params.get(key); params.is_auto(v))
      b.out.notes.push_back(
          params.where(key) + ": auto -> " +
          (std::string(key) == "lr" && lr_set_by
               ? "set at every step by DeepSpeed's " + *lr_set_by
               : "the run's train." + std::string(key) + " (" + run_or_default(run, key) + ")"));
  if (const json* v = params.get("lr"); v && !params.is_auto(v)) {
    const double lr = params.number(*v, "lr");
    if (lr_set_by)
      b.out.warnings.push_back(params.where("lr") + " has no effect: DeepSpeed's " + *lr_set_by +
                               " sets the lr at every step, here as in DeepSpeed");
    else
      b.train("lr", toml::value<double>(lr), params.where("lr"));
  }
  const struct {
    const char* ds;
    const char* key;
  } scalars[] = {{"eps", "eps"}, {"weight_decay", "weight_decay"}};
  for (const auto& k : scalars)
    if (const json* v = params.get(k.ds); v && !params.is_auto(v))
      b.train(k.key, toml::value<double>(params.number(*v, k.ds)), params.where(k.ds));
  if (const json* v = params.get("betas"); v && !params.is_auto(v)) {
    if (!v->is_array() || v->size() != 2)
      throw ConfigError(params.where("betas") + " is " + v->dump() + "; expected [beta1, beta2]");
    toml::array betas;
    for (const auto& x : *v) betas.push_back(params.number(x, "betas"));
    b.train("betas", std::move(betas), params.where("betas"));
  }
  const bool adamw = decoupled(opt, params, b);
  const json* torch = params.get("torch_adam");
  const bool torch_adam = torch && params.boolean(*torch, "torch_adam");
  if (torch_adam)
    b.out.notes.push_back(params.where("torch_adam") + ": true -> torch.optim." +
                          (adamw ? "AdamW" : "Adam") +
                          ", the same update as ztrain's (weight decay " +
                          (adamw ? "decoupled" : "added to the gradient, l2") + ")");
  fill_optimizer_defaults(params, b, torch_adam && adamw, !lr_set_by);
  params.finish();
  opt.finish();
}

// DeepSpeed's scheduler parameters, by the classes that take them.
struct SchedulerKey {
  const char* name;
  char type;  // 'n' number, 'i' integer (integral floats too), 'I' an int only, 's', 'b'
  std::set<std::string> classes;
};
const std::vector<SchedulerKey>& scheduler_keys() {
  static const std::set<std::string> warmup = {"WarmupLR", "WarmupDecayLR"},
                                     warm_all = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"},
                                     totals = {"WarmupDecayLR", "WarmupCosineLR"},
                                     cosine = {"WarmupCosineLR"}, cycle = {"OneCycle"},
                                     range = {"LRRangeTest"};
  static const std::vector<SchedulerKey> keys = {
      {"warmup_min_lr", 'n', warmup},
      {"warmup_max_lr", 'n', warmup},
      {"warmup_num_steps", 'I', warm_all},
      {"warmup_type", 's', warm_all},
      {"total_num_steps", 'i', totals},
      {"warmup_min_ratio", 'n', cosine},
      {"cos_min_ratio", 'n', cosine},
      {"cycle_min_lr", 'n', cycle},
      {"cycle_max_lr", 'n', cycle},
      {"decay_lr_rate", 'n', cycle},
      {"cycle_first_step_size", 'n', cycle},
      {"cycle_second_step_size", 'n', cycle},
      {"cycle_first_stair_count", 'i', cycle},
      {"cycle_second_stair_count", 'i', cycle},
      {"decay_step_size", 'i', cycle},
      {"cycle_momentum", 'b', cycle},
      {"lr_range_test_min_lr", 'n', range},
      {"lr_range_test_step_size", 'I', range},
      {"lr_range_test_step_rate", 'n', range},
      {"lr_range_test_staircase", 'b', range},
  };
  return keys;
}

// "auto" as the Hugging Face Trainer fills a scheduler's values: from the
// run (its lr, warmup steps and length), warmup_min_lr 0.
bool fill_auto(const std::string& key, const RunConfig& run, Section& params, Builder& b) {
  const std::map<std::string, std::pair<std::string, std::string>> from = {
      {"warmup_max_lr", {"lr", "the run's train.lr"}},
      {"warmup_num_steps", {"warmup_steps", "the run's train.warmup_steps"}},
      {"total_num_steps", {"steps", "the run's train.steps"}}};
  if (key == "warmup_min_lr") {
    b.train("scheduler.warmup_min_lr", toml::value<double>(0.0), params.where(key));
    b.out.notes.push_back(params.where(key) + ": auto -> 0");
    return true;
  }
  const auto it = from.find(key);
  if (it == from.end()) return false;
  const auto& [run_key, words] = it->second;
  const toml::node* v = run_value(run, "train." + run_key);
  b.out.consumed.push_back("train." + run_key);
  b.out.notes.push_back(params.where(key) + ": auto -> " + words + " (" +
                        run_or_default(run, run_key) + ")");
  if (key == "warmup_max_lr")
    b.train("scheduler.warmup_max_lr", toml::value<double>(v ? v->value_or(3e-3) : 3e-3),
            params.where(key));
  if (key == "warmup_num_steps")
    b.train("scheduler.warmup_num_steps",
            toml::value<std::int64_t>(std::max<std::int64_t>(1, v ? v->value_or(30) : 30)),
            params.where(key));
  if (key == "total_num_steps")
    b.train("scheduler.total_num_steps",
            toml::value<std::int64_t>(std::max<std::int64_t>(1, v ? v->value_or(300) : 300)),
            params.where(key));
  return true;
}

// One scheduler parameter onto [train.scheduler], checked as DeepSpeed's
// constructor checks it.
void map_scheduler_key(const SchedulerKey& k, const json& v, Section& params, Builder& b) {
  const std::string key = k.name, where = params.where(key);
  const std::string to = "scheduler." + key;
  switch (k.type) {
    case 'n':
      b.train(to, toml::value<double>(params.number(v, key)), where);
      return;
    case 'b':
      b.train(to, toml::value<bool>(params.boolean(v, key)), where);
      return;
    case 's': {
      std::string type = params.string(v, key);
      if (type != "log" && type != "linear") {
        b.out.warnings.push_back(where + " is \"" + type +
                                 "\", which DeepSpeed does not know: it warns and warms up "
                                 "by \"log\", and so does ztrain");
        type = "log";
      }
      b.train(to, toml::value<std::string>(type), where);
      return;
    }
    default: {
      if (k.type == 'I' && !v.is_number_integer())
        throw ConfigError(where + " is " + v.dump() +
                          "; DeepSpeed takes a positive integer here (it refuses " + v.dump() +
                          ")");
      const std::int64_t n = params.integer(v, key);
      if (key == "total_num_steps" && n == 0)
        throw ConfigError(where +
                          " is 0: DeepSpeed then ends the decay at the warmup's end; "
                          "give that step (warmup_num_steps) or the decay's real end");
      if (n < (k.type == 'I' ? 1 : 0))
        throw ConfigError(where + " is " + std::to_string(n) + "; DeepSpeed takes " +
                          (k.type == 'I' ? "a positive integer" : "0 or more") + " here");
      b.train(to, toml::value<std::int64_t>(n), where);
    }
  }
}

// What DeepSpeed's constructors require or refuse beyond one key's type.
void check_scheduler(const std::string& type, Section& params, std::vector<std::string>& warnings) {
  const auto need = [&](const char* key) {
    if (!params.get(key))
      throw ConfigError(params.where(key) + " is missing; DeepSpeed's " + type +
                        " requires it (\"auto\": the run's, as the Hugging Face Trainer fills it)");
  };
  if (type == "WarmupDecayLR" || type == "WarmupCosineLR") need("total_num_steps");
  if (type != "OneCycle") return;
  need("cycle_min_lr");
  need("cycle_max_lr");
  const json* m = params.get("cycle_momentum");
  if (!m || params.boolean(*m, "cycle_momentum"))
    throw ConfigError(params.where("cycle_momentum") + " is " + (m ? "true" : "unset (true)") +
                      ": DeepSpeed's OneCycle then also cycles Adam's beta1 (and sets beta2 to "
                      "0.99); ztrain cycles only the lr: set \"cycle_momentum\": false");
  if (const json* v = params.get("cycle_first_step_size");
      v && params.number(*v, "cycle_first_step_size") <= 0)
    throw ConfigError(params.where("cycle_first_step_size") + " is " + v->dump() +
                      "; DeepSpeed requires a positive step size");
  if (const json* v = params.get("cycle_second_step_size");
      v && params.number(*v, "cycle_second_step_size") < 0)
    throw ConfigError(params.where("cycle_second_step_size") + " is " + v->dump() +
                      "; DeepSpeed requires 0 or more");
  params.no_effect({{"cycle_min_mom", "cycle_momentum is false"},
                    {"cycle_max_mom", "cycle_momentum is false"},
                    {"decay_mom_rate", "cycle_momentum is false"}},
                   warnings);
}

// DeepSpeed's scheduler onto [train] schedule and [train.scheduler]: the
// same class, its parameters under their own names, "auto" filled from the
// run. A parameter the class does not take is refused (DeepSpeed's
// constructor would raise); so is a missing "params" (the engine passes
// **params). Without a scheduler the run's own schedule applies, as the
// Hugging Face Trainer applies its own: said in a note.
void map_scheduler(Section& top, const RunConfig& run, Builder& b) {
  Section sched = top.sub("scheduler");
  const json* t = sched.get("type");
  if (!t) {
    if (top.get("scheduler"))
      throw ConfigError(sched.where("type") + " is missing; name DeepSpeed's scheduler class");
    b.out.notes.push_back(top.where("scheduler") + ": none -> the run's train.schedule (" +
                          run_text(run, "train.schedule", "cosine") +
                          "); DeepSpeed alone would keep the optimizer's lr constant");
    return;
  }
  const std::string type = sched.string(*t, "type");
  if (!is_deepspeed_schedule(type))
    throw ConfigError(sched.where("type") + " is \"" + type +
                      "\"; ztrain has DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR, "
                      "OneCycle and LRRangeTest");
  b.train("schedule", toml::value<std::string>(type), sched.where("type"));
  if (!sched.get("params"))
    throw ConfigError(sched.where("params") + " is missing; DeepSpeed's engine passes it to " +
                      type + " as keyword arguments: give {} for the defaults");
  Section params = sched.sub("params");
  for (const SchedulerKey& k : scheduler_keys()) {
    const json* v = params.get(k.name);
    if (!v) continue;
    if (!k.classes.contains(type))
      throw ConfigError(params.where(k.name) + " is not a parameter of DeepSpeed's " + type +
                        " (its constructor would refuse it); remove it");
    if (params.is_auto(v) && fill_auto(k.name, run, params, b)) continue;
    map_scheduler_key(k, *v, params, b);
  }
  check_scheduler(type, params, b.out.warnings);
  params.no_effect({{"last_batch_iteration", "a resumed run continues from its checkpoint"}},
                   b.out.warnings);
  params.finish();
  sched.finish();
}

// A ZeRO-3 key under its DeepSpeed name ("stage3_prefetch_bucket_size") or
// the field name DeepSpeed's ZeRO config also accepts for it
// ("prefetch_bucket_size", which LLaVA's configs use); both given is an
// error. The value, or nullptr.
const json* stage3_key(Section& zo, const std::string& key) {
  const json* v = zo.get(key);
  if (key.rfind("stage3_", 0) != 0) return v;
  const std::string plain = key.substr(7);
  const json* alias = zo.get(plain);
  if (v && alias)
    throw ConfigError(zo.where(key) + " and " + zo.where(plain) +
                      " are the same DeepSpeed field; give one of them");
  return v ? v : alias;
}

// The strategy plugin the stage and offload devices make.
std::string choose_plugin(std::int64_t stage, const std::string& opt_dev,
                          const std::string& param_dev, Section& zo, Section& oo, Section& op) {
  if (stage < 0 || stage > 3)
    throw ConfigError(zo.where("stage") + " is " + std::to_string(stage) + "; give 0 to 3");
  if (param_dev != "none" && stage != 3)
    throw ConfigError(op.where("device") + " is \"" + param_dev + "\" but " + zo.where("stage") +
                      " is " + std::to_string(stage) +
                      "; parameters are offloaded at stage 3 only");
  if (opt_dev == "nvme") {
    if (stage != 3)
      throw ConfigError(oo.where("device") + " is \"nvme\" but " + zo.where("stage") + " is " +
                        std::to_string(stage) + "; ztrain's NVMe offload is ZeRO-3 (set stage 3)");
    return "nvme_offload";
  }
  if (param_dev == "nvme")
    throw ConfigError(op.where("device") + " is \"nvme\" but " + oo.where("device") + " is \"" +
                      opt_dev + "\"; NVMe parameters go with NVMe optimizer state here");
  if (opt_dev == "cpu" || param_dev == "cpu") {
    if (stage == 0)
      throw ConfigError(oo.where("device") + " is \"cpu\" but " + zo.where("stage") +
                        " is 0; offloading needs a ZeRO stage (1-3)");
    return "cpu_offload";
  }
  static const char* const by_stage[] = {"ddp", "zero1", "zero2", "zero3"};
  return by_stage[stage];
}

std::string device_of(Section& s) {
  const json* v = s.get("device");
  if (!v) return "none";
  const std::string d = s.string(*v, "device");
  if (d != "none" && d != "cpu" && d != "nvme")
    throw ConfigError(s.where("device") + " is \"" + d +
                      "\"; expected \"none\", \"cpu\" or \"nvme\"");
  return d;
}

// offload_optimizer and offload_param beyond their devices (param_dev:
// offload_param.device, already read).
void map_offload_details(Section& oo, Section& op, const std::string& plugin,
                         const std::string& param_dev, Builder& b) {
  const bool nvme = plugin == "nvme_offload", offload = nvme || plugin == "cpu_offload";
  const auto copy = [&](Section& s, const std::string& table, const char* key, bool applies,
                        char type) {
    const json* v = s.get(key);
    if (!v) return;
    if (!applies) {
      b.out.warnings.push_back(s.where(key) + " has no effect in ztrain under " + plugin);
      return;
    }
    const std::string name = table + "." + key;
    if (type == 'b')
      b.strategy(name, toml::value<bool>(s.boolean(*v, key)), s.where(key));
    else if (type == 'i')
      b.strategy(name, toml::value<std::int64_t>(s.integer(*v, key)), s.where(key));
    else if (type == 'n')
      b.strategy(name, toml::value<double>(s.number(*v, key)), s.where(key));
    else
      b.strategy(name, toml::value<std::string>(s.string(*v, key)), s.where(key));
  };
  copy(oo, "offload_optimizer", "pin_memory", offload, 'b');
  copy(oo, "offload_optimizer", "nvme_path", nvme, 's');
  copy(oo, "offload_optimizer", "buffer_count", nvme, 'i');
  copy(oo, "offload_optimizer", "ratio", plugin == "cpu_offload", 'n');
  oo.no_effect({{"fast_init", "the swap files are written as the state is made"},
                {"pipeline_read", "reads always overlap the step"},
                {"pipeline_write", "writes always overlap the step"},
                {"pipeline", "reads and writes always overlap the step"}},
               b.out.warnings);
  const bool params_off = param_dev != "none";
  copy(op, "offload_param", "pin_memory", offload && params_off, 'b');
  copy(op, "offload_param", "nvme_path", nvme && params_off, 's');
  copy(op, "offload_param", "buffer_count", nvme && params_off, 'i');
  copy(op, "offload_param", "buffer_size", nvme && params_off, 'i');
  op.no_effect({{"max_in_cpu", "parameter shards on the host are all kept there"}}, b.out.warnings);
  oo.finish();
  op.finish();
}

void map_aio(Section& top, const std::string& plugin, Builder& b) {
  Section aio = top.sub("aio");
  const bool nvme = plugin == "nvme_offload";
  const struct {
    const char* key;
    char type;
  } keys[] = {{"block_size", 'i'},     {"queue_depth", 'i'},          {"single_submit", 'b'},
              {"overlap_events", 'b'}, {"intra_op_parallelism", 'i'}, {"thread_count", 'i'}};
  for (const auto& k : keys) {
    const json* v = aio.get(k.key);
    if (!v) continue;
    if (!nvme) {
      b.out.warnings.push_back(aio.where(k.key) + " has no effect in ztrain under " + plugin +
                               " (no NVMe I/O)");
      continue;
    }
    // DeepSpeed's newer name for intra_op_parallelism.
    const std::string key =
        std::string(k.key) == "thread_count" ? "intra_op_parallelism" : std::string(k.key);
    if (k.type == 'b')
      b.strategy("aio." + key, toml::value<bool>(aio.boolean(*v, k.key)), aio.where(k.key));
    else
      b.strategy("aio." + key, toml::value<std::int64_t>(aio.integer(*v, k.key)), aio.where(k.key));
  }
  aio.no_effect({{"use_gds", "no GPUDirect Storage on this device"}}, b.out.warnings);
  aio.finish();
}

// The hidden size "auto" bucket sizes are made from.
std::int64_t hidden_size(const RunConfig& run, const std::string& asked_by) {
  const toml::node* n = run_value(run, "model.n_embd");
  if (!n || !n->is_integer())
    throw ConfigError(asked_by + " is \"auto\", which is made from the model's hidden size: set " +
                      "[model] n_embd in the run file");
  return n->as_integer()->get();
}

void map_zero(Section& top, const RunConfig& run, Builder& b) {
  Section zo = top.sub("zero_optimization");
  const json* st = zo.get("stage");
  const std::int64_t stage = st ? zo.integer(*st, "stage") : 0;
  Section oo = zo.sub("offload_optimizer"), op = zo.sub("offload_param");
  std::string opt_dev = device_of(oo);
  const std::string param_dev = device_of(op);
  // DeepSpeed's deprecated "cpu_offload": true means offload_optimizer on
  // the cpu (its ZeRO config converts it).
  if (const json* c = zo.get("cpu_offload"); c && zo.boolean(*c, "cpu_offload")) {
    if (opt_dev != "none" && opt_dev != "cpu")
      throw ConfigError(zo.where("cpu_offload") + " is true but " + oo.where("device") + " is \"" +
                        opt_dev + "\"; give one of them");
    opt_dev = "cpu";
    b.out.notes.push_back(
        zo.where("cpu_offload") +
        ": true -> offload_optimizer.device \"cpu\" (DeepSpeed's older spelling)");
  }
  const std::string plugin = choose_plugin(stage, opt_dev, param_dev, zo, oo, op);
  b.strategy("plugin", toml::value<std::string>(plugin),
             st ? zo.where("stage") : zo.where("stage") + " (absent: 0)");
  if (plugin == "cpu_offload")
    b.strategy("stage", toml::value<std::int64_t>(stage), zo.where("stage"));
  if (plugin == "cpu_offload" || plugin == "nvme_offload") {
    b.strategy("offload_optimizer.device", toml::value<std::string>(opt_dev), oo.where("device"));
    if (param_dev != "none")
      b.strategy("offload_param.device", toml::value<std::string>(param_dev), op.where("device"));
  }
  const bool zero3 = stage == 3;
  // The bucket and gather keys: (DeepSpeed key, ztrain option, applies here).
  const struct {
    const char* ds;
    const char* key;
    bool applies;
    double auto_factor;  // "auto" = factor * hidden^power; 0: no auto
    int power;
  } sizes[] = {
      {"reduce_bucket_size", "reduce_bucket_size", true, 1.0, 2},
      {"allgather_bucket_size", "allgather_bucket_size", stage == 1 || stage == 2, 0, 0},
      {"stage3_prefetch_bucket_size", "prefetch_bucket_size", zero3, 0.9, 2},
      {"stage3_param_persistence_threshold", "param_persistence_threshold", zero3, 10.0, 1},
      {"stage3_max_live_parameters", "max_live_parameters", zero3, 0, 0},
      {"stage3_max_reuse_distance", "max_reuse_distance", zero3, 0, 0},
      {"sub_group_size", "sub_group_size", plugin == "nvme_offload", 0, 0},
  };
  for (const auto& k : sizes) {
    const json* v = stage3_key(zo, k.ds);
    if (!v) continue;
    if (!k.applies) {
      b.out.warnings.push_back(zo.where(k.ds) + " has no effect in ztrain under " + plugin +
                               (std::string(k.ds) == "sub_group_size"
                                    ? " (it steps each rank's whole shard at once)"
                                    : " (DeepSpeed ignores it at this stage too)"));
      continue;
    }
    std::int64_t n = 0;
    if (zo.is_auto(v)) {
      if (k.auto_factor == 0)
        throw ConfigError(zo.where(k.ds) +
                          " is \"auto\", which DeepSpeed does not resolve; give a number");
      const double h = static_cast<double>(hidden_size(run, zo.where(k.ds)));
      n = static_cast<std::int64_t>(k.auto_factor * std::pow(h, k.power));
      b.out.notes.push_back(
          zo.where(k.ds) + ": auto -> " + std::to_string(n) + " (" +
          (k.power == 2 ? (k.auto_factor == 1.0 ? "hidden²" : "0.9·hidden²") : "10·hidden") +
          ", hidden = n_embd " + std::to_string(static_cast<std::int64_t>(h)) + ")");
    } else {
      n = zo.integer(*v, k.ds);
    }
    b.strategy(k.key, toml::value<std::int64_t>(n), zo.where(k.ds));
  }
  for (const char* key : {"overlap_comm", "contiguous_gradients"})
    if (const json* v = zo.get(key))
      b.strategy(key, toml::value<bool>(zo.boolean(*v, key)), zo.where(key));
  stage3_key(zo, "stage3_gather_16bit_weights_on_model_save");
  zo.no_effect({{"stage3_gather_16bit_weights_on_model_save",
                 "ztrain always writes consolidated weights (model.safetensors, `ztrain export`)"},
                {"gather_16bit_weights_on_model_save",
                 "ztrain always writes consolidated weights (model.safetensors, `ztrain export`)"},
                {"stage3_gather_fp16_weights_on_model_save",
                 "ztrain always writes consolidated weights (model.safetensors, `ztrain export`)"},
                {"reduce_scatter", "gradients are always reduce-scattered at stages 1-3"},
                {"allgather_partitions", "parameters are always all-gathered"},
                {"round_robin_gradients", "gradient copies are not spread over ranks"},
                {"elastic_checkpoint", "checkpoints resume on any world size anyway"},
                {"ignore_unused_parameters", "every parameter is used"},
                {"load_from_fp32_weights", "checkpoints always hold fp32 masters"},
                {"zero_hpz_partition_size", "no hierarchical partitioning"},
                {"zero_quantized_weights", "no quantized communication"},
                {"zero_quantized_gradients", "no quantized communication"}},
               b.out.warnings);
  map_offload_details(oo, op, plugin, param_dev, b);
  zo.finish();
}

// The mesh's degrees DeepSpeed names: Ulysses' sequence_parallel_size and
// AutoTP's tensor_parallel.autotp_size, onto [parallel] sequence and
// tensor (where the run checks them, today refusing any above 1 by the
// DeepSpeed key they came from).
void map_parallel(Section& top, Builder& b) {
  if (const json* v = top.get("sequence_parallel_size"))
    b.parallel("sequence", top.integer(*v, "sequence_parallel_size"),
               top.where("sequence_parallel_size"));
  Section tp = top.sub("tensor_parallel");
  if (const json* v = tp.get("autotp_size"))
    b.parallel("tensor", tp.integer(*v, "autotp_size"), tp.where("autotp_size"));
  tp.finish();
}

// The top level's remaining keys: monitoring and features ztrain does
// not have.
void map_rest(Section& top, Builder& b) {
  top.no_effect(
      {{"zero_allow_untested_optimizer", "ztrain's optimizer is AdamW, tested under every stage"},
       {"zero_force_ds_cpu_optimizer", "the host steps with ztrain's own AdamW"},
       {"wall_clock_breakdown", "metrics.jsonl logs step times and communication waits"},
       {"memory_breakdown", "metrics.jsonl logs peak bytes per tier and category"},
       {"tensorboard", "monitoring goes to metrics.jsonl"},
       {"wandb", "monitoring goes to metrics.jsonl"},
       {"csv_monitor", "monitoring goes to metrics.jsonl"},
       {"comms_logger", "metrics.jsonl counts every collective's calls and bytes"},
       {"flops_profiler", "the summary reports model FLOP/s"},
       {"dump_state", "nothing to dump"},
       {"checkpoint", "set [train] checkpoint_every and keep_last"},
       {"activation_checkpointing",
        "set [model] activation_checkpointing (and offload_checkpoints for its cpu_checkpointing)"},
       {"prescale_gradients", "gradients are averaged once, after the reduction"},
       {"sparse_gradients", "gradients are dense"}},
      b.out.warnings);
  if (const json* v = top.get("gradient_predivide_factor");
      v && top.number(*v, "gradient_predivide_factor") != 1.0)
    throw ConfigError(top.where("gradient_predivide_factor") +
                      " is not 1; ztrain averages gradients in fp32 and has no predivision");
  if (const json* v = top.get("communication_data_type");
      v && top.string(*v, "communication_data_type") != "fp32")
    throw ConfigError(top.where("communication_data_type") +
                      " is not \"fp32\"; gradients travel in train.grad_dtype (16-bit ones are "
                      "summed in fp32): remove it and set [train] grad_dtype");
  top.finish();
}

json read_json(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw ConfigError("cannot read DeepSpeed config '" + file.string() + "'" +
                      (std::filesystem::exists(file) ? ": permission denied" : ": no such file"));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    json j = json::parse(ss.str());
    if (!j.is_object())
      throw ConfigError("DeepSpeed config '" + file.string() + "' is not a JSON object");
    return j;
  } catch (const json::exception& e) {  // parse_error, and out_of_range for 1e999
    throw ConfigError("DeepSpeed config '" + file.string() + "' is not valid JSON: " + e.what());
  }
}

}  // namespace

// Every [train] value the import sets (one level of subtables: fp16,
// scheduler), as "train.key" paths.
std::vector<std::string> imported_paths(const toml::table& train) {
  std::vector<std::string> out;
  for (const auto& [k, v] : train) {
    const std::string key(k.str());
    if (const auto* sub = v.as_table())
      for (const auto& [k2, v2] : *sub) out.push_back("train." + key + "." + std::string(k2.str()));
    else
      out.push_back("train." + key);
  }
  return out;
}

// What the import does to the run's own values. Each one it replaces is
// said with both values. Under an imported DeepSpeed scheduler, the run's
// schedule keys that scheduler does not read are superseded: they leave
// the run (which would otherwise refuse them as unread), with a note.
void note_run_changes(ImportedConfig& out, const RunConfig& run) {
  for (const std::string& path : imported_paths(out.train)) {
    const std::string was = run_text(run, path, "");
    const std::string now = table_text(out.train, path.substr(6), "");
    if (!run_value(run, path) || was == now) continue;
    out.notes.push_back(out.origins[path] + ": " + path + " = " + now + " replaces " +
                        run.where(path) + " " + path + " = " + was);
  }
  const auto* schedule = out.train.get_as<std::string>("schedule");
  if (!schedule) return;
  const std::string name = schedule->get();
  std::vector<std::string> candidates = {"lr", "min_lr", "warmup_steps"};
  if (const auto* t = run.table().at_path("train.scheduler").as_table())
    for (const auto& [k, v] : *t) candidates.push_back("scheduler." + std::string(k.str()));
  // The run's [train.scheduler] keys go whether the class reads them or not:
  // what the file leaves out takes DeepSpeed's default, as in DeepSpeed.
  for (const std::string& key : candidates) {
    if (!run_value(run, "train." + key) || out.origins.contains("train." + key)) continue;
    const bool own = key.rfind("scheduler.", 0) == 0;
    const bool reads = !own && schedule_reads(name, key) &&
                       !(key == "lr" && name == "WarmupLR" &&
                         out.origins.contains("train.scheduler.warmup_max_lr"));
    if (reads) continue;
    out.superseded.push_back("train." + key);
    out.notes.push_back(run.where("train." + key) + ": train." + key + " = " +
                        run_text(run, "train." + key, "") + " is dropped: " +
                        (own ? "the imported " + name +
                                   " takes DeepSpeed's default where the file "
                                   "gives none"
                             : "the imported " + name + " does not read it"));
  }
}

namespace {
ImportedConfig import_deepspeed_json(const json& j, const std::string& name, const RunConfig& run);
}  // namespace

ImportedConfig import_deepspeed(const std::filesystem::path& json_file, const RunConfig& run) {
  return import_deepspeed_json(read_json(json_file), json_file.filename().string(), run);
}

ImportedConfig import_deepspeed_text(const std::string& text, const std::string& name,
                                     const RunConfig& run) {
  return import_deepspeed_json(json::parse(text), name, run);
}

namespace {

ImportedConfig import_deepspeed_json(const json& j, const std::string& name, const RunConfig& run) {
  ImportedConfig out;
  Builder b{out};
  Section top(&j, "", name);
  map_batch(top, run, b);
  map_precision(top, run, b);
  map_optimizer(top, run, b, lr_set_by_scheduler(j));
  map_scheduler(top, run, b);
  map_zero(top, run, b);
  map_aio(top, out.strategy["plugin"].value_or(std::string("ddp")), b);
  map_parallel(top, b);
  map_rest(top, b);
  note_run_changes(out, run);
  return out;
}

// One table and its subtables as TOML lines, values in their shortest form.
void write_table(std::ostringstream& s, const std::string& name, const toml::table& t) {
  s << "\n[" << name << "]\n";
  for (const auto& [k, v] : t)
    if (!v.is_table()) s << k.str() << " = " << toml_value_text(v) << "\n";
  for (const auto& [k, v] : t)
    if (const auto* sub = v.as_table()) write_table(s, name + "." + std::string(k.str()), *sub);
}

}  // namespace

std::string imported_notes(const ImportedConfig& c, const std::filesystem::path& json_file) {
  std::ostringstream s;
  s << "# converted from " << json_file.string() << " by ztrain convert-deepspeed\n";
  for (const auto& n : c.notes) s << "# " << n << "\n";
  for (const auto& w : c.warnings) s << "# warning: " << w << "\n";
  return s.str();
}

std::string imported_toml(const ImportedConfig& c, const std::filesystem::path& json_file) {
  std::ostringstream s;
  s << imported_notes(c, json_file);
  write_table(s, "train", c.train);
  if (!c.parallel.empty()) write_table(s, "parallel", c.parallel);
  write_table(s, "strategy", c.strategy);
  return s.str();
}

}  // namespace ztrain
