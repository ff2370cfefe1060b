#include "checkpoint/adapter_import.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/tensor_parts.h"
#include "checkpoint/weights.h"
#include "io/safetensors.h"
#include "job/rank_agreement.h"
#include "ztrain/error.h"

namespace ztrain {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw DataError("adapter_from: cannot read '" + path.string() + "'");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw DataError("adapter_from: '" + path.string() + "' is not JSON (" + e.what() + ")");
  }
}

// The file's LoRA against the run's, key by key.
void check_config(const json& file, const json& run, const fs::path& path,
                  const std::string& where) {
  const auto value = [](const json& j, const char* key) {
    return j.contains(key) ? j.at(key).dump() : std::string("null");
  };
  if (value(file, "peft_type") != "\"LORA\"")
    throw ConfigError(where + ": " + path.string() + " is a " + value(file, "peft_type") +
                      " adapter; adapter_from takes LoRA adapters");
  if (file.value("use_dora", false))
    throw ConfigError(where + ": " + path.string() +
                      " sets use_dora, which ztrain's LoRA does not build; give a plain LoRA "
                      "adapter");
  if (file.value("bias", std::string("none")) != "none" ||
      (file.contains("modules_to_save") && !file.at("modules_to_save").is_null()))
    throw ConfigError(where + ": " + path.string() +
                      " trains biases or whole modules beside its adapters (bias, "
                      "modules_to_save), which ztrain does not build");
  if (file.value("use_rslora", false) != run.at("use_rslora").get<bool>())
    throw ConfigError(where + ": " + path.string() + " has use_rslora = " +
                      value(file, "use_rslora") + ", this run's [model] use_rslora gives " +
                      value(run, "use_rslora") + "; set use_rslora to the adapter's");
  const std::pair<const char*, const char*> keys[] = {{"r", "lora_rank"},
                                                      {"lora_alpha", "lora_alpha"}};
  for (const auto& [key, ours] : keys)
    if (file.value(key, 0.0) != run.at(key).get<double>())
      throw ConfigError(where + ": " + path.string() + " has " + key + " = " + value(file, key) +
                        ", this run's [model] " + ours + " gives " + value(run, key) + "; set " +
                        ours + " to the adapter's");
}

// The adapters' master values from the file, a fresh optimizer.
class AdapterSource final : public StateSource {
 public:
  AdapterSource(const SafetensorsReader& file, const ParamSpecs& params)
      : file_(file), params_(params), entries_(params.size(), nullptr) {
    TensorDifferences d;
    std::set<std::string> used;
    for (ParamId p : params.ids()) {
      if (!params[p].adapter) continue;
      const std::string name = "base_model.model." + external_name(params[p]);
      const SafetensorsEntry* e = file.find(name);
      if (!e) {
        d.missing.push_back(name + " " + params[p].shape.str());
      } else if (e->shape != params[p].shape) {
        d.misshaped.push_back(name + ": " + e->shape.str() + " in the file, " +
                              params[p].shape.str() + " expected");
      } else {
        entries_[p] = e;
        used.insert(name);
      }
    }
    for (const SafetensorsEntry& e : file.entries())
      if (!used.contains(e.name)) d.unexpected.push_back(e.name + " " + e.shape.str());
    if (d.count() > 0)
      throw DataError(file.path().string() + ": does not hold this run's adapters:" + d.listed() +
                      "\ncheck [model] lora_target and lora_rank against the adapter's "
                      "adapter_config.json");
  }
  void get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a, float* out) override {
    if (!entries_.at(p))
      throw InternalError("adapter_from: the strategy asked for " + params_[p].name +
                          ", which is no adapter");
    if (a != StateArray::master) return std::fill(out, out + count, 0.0f);
    file_.read_f32(*entries_[p], first, count, out);
  }

 private:
  const SafetensorsReader& file_;
  const ParamSpecs& params_;
  IdVector<ParamId, const SafetensorsEntry*> entries_;
};

}  // namespace

void import_adapter(const Model& model, Strategy& strategy, const fs::path& dir,
                    const std::string& where, Communicator& comm) {
  const std::string run_config = model.adapter_config_json();
  if (run_config.empty())
    throw ConfigError(where +
                      ": [model] adapter_from starts LoRA's adapters, and this run has "
                      "none; set finetuning_type = \"lora\"");
  // The file holds whole adapters; a tensor-parallel rank reads its parts.
  const auto params = model.params();
  const ParamSpecs whole = whole_specs(params);
  std::optional<SafetensorsReader> file;
  std::optional<AdapterSource> source;
  std::string why;
  try {
    check_config(read_json(dir / "adapter_config.json"), json::parse(run_config),
                 dir / "adapter_config.json", where);
    file.emplace(dir / "adapter_model.safetensors");
    source.emplace(*file, whole);
  } catch (const Error& e) {
    why = e.what();
  }
  stop_together<DataError>(why,
                           "adapter_from: another rank cannot read the adapter (its error "
                           "is above)",
                           comm);
  PartSource parts(*source, params);
  strategy.load_state(parts);
}

}  // namespace ztrain
