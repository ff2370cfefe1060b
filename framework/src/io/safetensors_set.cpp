#include "io/safetensors_set.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "ztrain/error.h"

namespace ztrain {
namespace fs = std::filesystem;

fs::path SafetensorsSet::weights_at(const fs::path& path) {
  if (!fs::is_directory(path)) return path;
  if (fs::exists(path / "model.safetensors")) return path / "model.safetensors";
  if (fs::exists(path / "model.safetensors.index.json"))
    return path / "model.safetensors.index.json";
  return path / "model.safetensors";
}

// The index's weight_map, tensor -> shard, each shard opened once and
// checked to hold the tensors the index places in it.
SafetensorsSet::SafetensorsSet(const fs::path& path) : path_(weights_at(path)) {
  if (path_.extension() != ".json") {
    readers_.push_back(std::make_unique<SafetensorsReader>(path_));
    return;
  }
  std::ifstream in(path_);
  if (!in) throw DataError("cannot read '" + path_.string() + "'");
  const auto index = nlohmann::json::parse(in, nullptr, false);
  const auto map = index.is_object() ? index.find("weight_map") : index.end();
  if (map == index.end() || !map->is_object() || map->empty())
    throw DataError(path_.string() + ": no weight_map naming each tensor's shard");
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [tensor, shard] : map->items()) {
    if (!shard.is_string())
      throw DataError(path_.string() + ": weight_map[\"" + tensor + "\"] is not a file name");
    by_shard[shard.get<std::string>()].push_back(tensor);
  }
  for (const auto& [shard, tensors] : by_shard) {
    const fs::path file = path_.parent_path() / shard;
    if (!fs::exists(file))
      throw DataError(path_.string() + " names the shard '" + shard + "', which is not there");
    readers_.push_back(std::make_unique<SafetensorsReader>(file));
    for (const std::string& t : tensors)
      if (!readers_.back()->find(t))
        throw DataError(path_.string() + " places '" + t + "' in '" + shard + "', which lacks it");
  }
  std::map<std::string, std::string> seen;
  for (const auto& r : readers_)
    for (const SafetensorsEntry& e : r->entries())
      if (const auto [it, fresh] = seen.emplace(e.name, r->path().filename().string()); !fresh)
        throw DataError(path_.string() + ": '" + e.name + "' is in both '" + it->second +
                        "' and '" + r->path().filename().string() + "'");
}

std::optional<SafetensorsSet::Tensor> SafetensorsSet::find(const std::string& name) const {
  for (const auto& r : readers_)
    if (const SafetensorsEntry* e = r->find(name)) return Tensor{r.get(), e};
  return std::nullopt;
}

std::vector<SafetensorsSet::Tensor> SafetensorsSet::all() const {
  std::vector<Tensor> out;
  for (const auto& r : readers_)
    for (const SafetensorsEntry& e : r->entries()) out.push_back({r.get(), &e});
  return out;
}

std::vector<std::string> SafetensorsSet::files() const {
  std::vector<std::string> out;
  for (const auto& r : readers_) out.push_back(r->path().string());
  return out;
}

}  // namespace ztrain
