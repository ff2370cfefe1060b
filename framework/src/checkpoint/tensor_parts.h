// A tensor-parallel run's optimizer state in the whole model's coordinates.
//
// A checkpoint lists whole parameters and stores element ranges of them
// (optimizer_state.h), whatever the layout that wrote it: that is what lets
// a run resume on another mesh. Under tensor parallelism a rank's strategy
// saves and loads ranges of its parts (ParamSpec::split). WholeSink turns
// each range of a part into the runs of whole elements it holds
// (TensorSplit::whole_index, run_length: one run for a part cut by rows or
// by vocabulary, one a row for a part cut by columns) and keeps a
// parameter the tensor group shares from being stored once per rank: the
// group's first rank writes one it holds whole, the first of its holders a
// copied part. PartSource reads a part's ranges from the whole runs. At
// tensor 1 (no part split, one writer) both pass every range through
// unchanged. Under pipeline parallelism a stage's parameters go by their
// whole-model ids (ParamSpec::model_id), and a tied copy is left to the
// stage holding the original (read back from it on resume).
//
// The parameter list a checkpoint of such a run records is the whole
// model's (weights.h's whole_specs).
//
// Ownership: both wrap a sink or source they do not own, which must
// outlive them, and keep a reference to the specs.
// Errors: the wrapped sink's and source's.
// Thread safety: one caller at a time, as their interfaces.
#pragma once

#include "ztrain/model.h"
#include "ztrain/optimizer_state.h"

namespace ztrain {

class WholeSink final : public StateSink {
 public:
  // params: the rank's (parts); tensor_rank: its place in the tensor group.
  WholeSink(StateSink& inner, const ParamSpecs& params, int tensor_rank)
      : inner_(inner), params_(params), tensor_rank_(tensor_rank) {}
  void put(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
           const float* values) override;

 private:
  StateSink& inner_;
  const ParamSpecs& params_;
  int tensor_rank_;
};

class PartSource final : public StateSource {
 public:
  PartSource(StateSource& inner, const ParamSpecs& params) : inner_(inner), params_(params) {}
  void get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a, float* out) override;

 private:
  StateSource& inner_;
  const ParamSpecs& params_;
};

}  // namespace ztrain
