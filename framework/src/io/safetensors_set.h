// SafetensorsSet: the weights of a model as one set of tensors, whether
// they are one .safetensors file or Hugging Face's shards: a directory's
// model.safetensors, else its model.safetensors.index.json, whose
// weight_map names the shard (model-00001-of-00004.safetensors, ...) of
// each tensor. Every shard is opened (mapped) once; a tensor is read from
// its own shard.
//
// The index is checked against the shards before any tensor is handed
// out: a shard it names that is missing, a tensor it places in a shard
// that lacks it, and a tensor found in two shards are DataErrors naming
// the files and the tensor.
//
// Thread safety: immutable after construction.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace ztrain {

class SafetensorsSet {
 public:
  // `path`: a .safetensors file, or a directory holding model.safetensors
  // or model.safetensors.index.json.
  explicit SafetensorsSet(const std::filesystem::path& path);

  struct Tensor {
    const SafetensorsReader* file;
    const SafetensorsEntry* entry;
  };
  std::optional<Tensor> find(const std::string& name) const;
  // Every tensor of every file, file by file.
  std::vector<Tensor> all() const;
  // The files read (one, or the shards), for messages and for ranks to
  // compare.
  std::vector<std::string> files() const;
  // What was named: the file, or the index.
  const std::filesystem::path& path() const { return path_; }

  // Where `path` keeps its weights (the file, model.safetensors or the
  // index), whether or not it is there.
  static std::filesystem::path weights_at(const std::filesystem::path& path);

 private:
  std::filesystem::path path_;
  std::vector<std::unique_ptr<SafetensorsReader>> readers_;
};

}  // namespace ztrain
