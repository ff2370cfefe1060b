// Which of a model's modules each virtual stage of a pipeline runs: a pure
// plan over the modules in execution order (the transformer's: the
// embedding, each block, the head), so the embedding and the head are
// counted like any block.
//
// Two methods, DeepSpeed's PipelineModule names:
// - uniform: as many modules a stage as can be, the first stages one more
//   where they do not divide (DeepSpeed's partition_uniform).
// - parameters: the heaviest stage as light as can be, weighing a module by
//   the elements of the parameters it uses; a parameter two modules use (a
//   head tied to the embedding) weighs in both, as both stages hold it.
//   DeepSpeed weighs only trainable parameters; here every one counts,
//   because a frozen base weight (LoRA's) costs its stage the same memory
//   and compute. Among the lightest-heaviest splits, the one with the
//   earliest stages fullest.
//
// Thread safety: pure functions. Errors: ConfigError when there are fewer
// modules than parts (a stage would run nothing), naming both counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "ztrain/export.h"
#include "ztrain/model.h"

namespace ztrain::pipeline {

enum class PartitionMethod : std::uint8_t { uniform, parameters };

// "uniform" or "parameters"; ConfigError for another name, listing both.
ZTRAIN_API PartitionMethod partition_method(std::string_view name);

// Each module's weight for `parameters`: the elements of the parameters
// whose used_by names it.
ZTRAIN_API std::vector<std::uint64_t> module_weights(const ParamSpecs& params, std::size_t modules);

// parts + 1 bounds: part p runs modules [bounds[p], bounds[p + 1]).
// `weights` has one entry a module (uniform reads only their count).
ZTRAIN_API std::vector<std::size_t> partition_modules(const std::vector<std::uint64_t>& weights,
                                                      std::size_t parts, PartitionMethod method);

// The chunks pipeline stage `stage` of `stages` runs, in chunk order, from
// the bounds of the stages x chunks virtual stages (partition_modules):
// chunk c is virtual stage c * stages + stage (Megatron's interleaving).
ZTRAIN_API std::vector<ModuleRange> stage_chunks(const std::vector<std::size_t>& bounds,
                                                 std::size_t stages, std::size_t stage);

// The stages holding a parameter: those with a chunk running one of the
// modules in its used_by, in order (two for an embedding tied to a head on
// another stage).
ZTRAIN_API std::vector<std::size_t> stages_holding(const ParamSpec& param,
                                                   const std::vector<std::size_t>& bounds,
                                                   std::size_t stages);

}  // namespace ztrain::pipeline
