// Weights in and out as safetensors with Hugging Face names.
//
// Export writes every parameter under its hf_name (transposed where the
// Hugging Face layout is), in fp32, bf16 or fp16, through the strategy's
// read_param so sharded and offloaded parameters come out whole. A path
// ending in ".safetensors" receives the tensors; any other path is a
// directory that receives model.safetensors and the model's config.json,
// ready for from_pretrained.
//
// Import (initial weights) is weights_import.h.
//
// Errors: DataError naming the file.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/hf_export.h"
#include "ztrain/dtype.h"
#include "ztrain/model.h"
#include "ztrain/strategy.h"

namespace ztrain {

// A parameter's name and shape in a weights file: its Hugging Face name
// (else its own), and its shape transposed where Hugging Face keeps the
// layer as a Conv1D (in, out).
std::string external_name(const ParamSpec& p);
Shape external_shape(const ParamSpec& p);

// Writes every parameter of `model` to `out` (as above), each read whole in
// fp32 by `read` when its turn comes: one parameter in memory at a time.
using ReadParam = std::function<void(ParamId, float*)>;
// How a weights file differs from what a model expects, for a DataError:
// each non-empty group as "\n  N title:" and its first 8 items, then how
// many more; empty when every group is.
struct TensorDifferences {
  std::vector<std::string> missing, unexpected, misshaped;
  std::size_t count() const { return missing.size() + unexpected.size() + misshaped.size(); }
  std::string listed() const;
};

// The order write_weights reads parameters in: LoRA adapters first (merged
// into their weights, and written as PEFT's out/adapter/ where `out` is a
// directory), then the rest, each part in id order. Reads that are
// collective (a sharded strategy's) take it on every rank.
std::vector<ParamId> export_order(const ParamSpecs& params);
// `text`'s tokenizer (empty: none) and chat template go beside the
// weights, the tokenizer giving config.json its token ids
// (checkpoint/hf_export.h).
// `params` is the list `read` takes ids of (the model's, or under pipeline
// parallelism the whole model's, whose ids its adapters name).
void write_weights(const Model& model, const ParamSpecs& params, const std::filesystem::path& out,
                   DType dtype, const ReadParam& read, const TextFiles& text = {});

// A tensor-parallel part's spec as the whole parameter it is one of (its
// shape the whole's, split none); a whole parameter's unchanged.
ParamSpec whole_spec(const ParamSpec& part);
// Every spec of `params` whole: the list a checkpoint or an export of a
// tensor-parallel model records.
ParamSpecs whole_specs(const ParamSpecs& params);

// Where a rank's parameters are parts of the model's. tensor: the group
// gathering each parameter's parts (null at tensor 1). pipeline: the
// stages (null with one), `whole` the whole model's parameters and
// `bounds` the virtual stages' modules (pipeline/stage_partition.h), so
// each parameter comes from the first stage holding it.
struct ModelParts {
  Communicator* tensor = nullptr;
  Communicator* pipeline = nullptr;
  const ParamSpecs* whole = nullptr;
  std::vector<std::size_t> bounds;
};

// Collective (read_param is): every rank calls it, those with `write`
// false only take part in gathering the parameters. The file holds the
// whole model whatever `parts` split it into, as at world 1.
void export_weights(const Model& model, Strategy& strategy, const std::filesystem::path& out,
                    DType dtype, bool write = true, const TextFiles& text = {},
                    const ModelParts& parts = {});
// Before an export to `out` (a file or a directory, as export_weights):
// ConfigError when the weights would land on `source` (a file being read;
// empty: none), or on an existing file without `overwrite`.
void check_export_target(const std::filesystem::path& out, bool overwrite,
                         const std::filesystem::path& source = {});

// `ztrain export`: rewrites the weights of a run directory (its
// model.safetensors and config.json) or of a .safetensors file to `out`
// (a file or a directory, as export_weights) in `dtype`. ConfigError when
// the weights would land on the source itself, or on an existing file
// without `overwrite`.
void convert_weights(const std::filesystem::path& source, const std::filesystem::path& out,
                     DType dtype, bool overwrite = false);

}  // namespace ztrain
