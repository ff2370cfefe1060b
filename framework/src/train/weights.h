// Weights in and out as safetensors with Hugging Face names.
//
// Export writes every parameter under its hf_name (transposed where the
// Hugging Face layout is), in fp32, bf16 or fp16, through the strategy's
// read_param so sharded and offloaded parameters come out whole. A path
// ending in ".safetensors" receives the tensors; any other path is a
// directory that receives model.safetensors and the model's config.json,
// ready for from_pretrained.
//
// Import matches each parameter by hf_name or name, checks shapes, and
// reports every missing, unexpected and mis-shaped tensor at once.
//
// Errors: DataError naming the file and each difference.
#pragma once

#include <filesystem>
#include <functional>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/dtype.h"
#include "ztrain/model.h"
#include "ztrain/strategy.h"

namespace ztrain {

// Writes every parameter of `model` to `out` (as above), each read whole in
// fp32 by `read` when its turn comes: one parameter in memory at a time.
using ReadParam = std::function<void(ParamId, float*)>;
void write_weights(const Model& model, const std::filesystem::path& out, DType dtype,
                   const ReadParam& read);

// Collective (read_param is): every rank calls it, those with `write`
// false only take part in gathering the parameters.
void export_weights(const Model& model, Strategy& strategy, const std::filesystem::path& out,
                    DType dtype, bool write = true);
// Sets every parameter from the safetensors file `in` (or in/model.safetensors).
// Collective: where every rank sees the file, each reads it; where some
// rank cannot (a host without the file), rank 0 reads it and broadcasts one
// parameter at a time, in pieces of at most 16M elements, so no rank holds
// more than its largest parameter. DataError when rank 0 cannot read it or
// it does not match the model (every rank raises one).
struct WeightsImport {
  bool from_rank_0 = false;       // sent by rank 0
  std::uint64_t bytes_moved = 0;  // between ranks, summed over them
  double seconds = 0;
};
WeightsImport import_weights(const Model& model, Strategy& strategy,
                             const std::filesystem::path& in, Communicator& comm);

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
