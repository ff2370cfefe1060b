// Initial weights (`[model] init_from`): a safetensors file, or the shards
// of a Hugging Face directory's model.safetensors.index.json
// (io/safetensors_set.h), into a strategy, each rank taking only the
// elements its strategy holds.
//
// The weights enter through Strategy::load_state, as a checkpoint's state
// does: the file is a StateSource whose master values are its tensors
// (matched by Hugging Face name or own name, shapes checked, every
// missing, unexpected and mis-shaped tensor reported at once), with m and
// v zero, a fresh optimizer. So a rank reads exactly the element ranges
// its strategy asks for (a sharded strategy its shard, ddp everything),
// and the strategy makes its working copy from them as after a resume.
//
// Where every rank sees the file (a shared file system, or a copy on
// every host: the copies are compared first, so a stale one is refused),
// each reads its own ranges. Where some rank cannot, rank 0 reads the
// ranges of the other ranks and sends each rank its own, in bounded
// rounds; they reach the strategy through a local scratch file, so no
// rank holds more than a round of them in memory.
//
// Errors: DataError (on every rank) when rank 0 cannot read the file or it
// does not match the model, when a rank cannot keep what it receives, or
// when a value is NaN or infinite (naming the tensor and element: weights
// saved from a diverged run would otherwise be found as a loss of NaN
// after the first step).
// Thread safety: collective; the training thread only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/state_relay.h"
#include "io/safetensors_set.h"
#include "ztrain/comm.h"
#include "ztrain/model.h"
#include "ztrain/optimizer_state.h"
#include "ztrain/strategy.h"

namespace ztrain {

// A weights file as a state source: the master values of any element range
// of a parameter, in the model's layout (a Hugging Face Conv1D weight is
// read a segment of each of its file rows at a time, never whole), and
// zero m and v. An adapter a fine-tuning method adds (ParamSpec::adapter)
// is read from the file where it has it, else it gets its initial value
// under `seed` (shard/init.h), as a fresh run draws it. Holds references:
// file and params outlive it. DataError (from the constructor) when the
// file does not match the model.
class WeightsFile final : public StateSource {
 public:
  // whole: under pipeline parallelism the whole model's parameters, which
  // the file must match (the model's are the stage's); null otherwise.
  WeightsFile(const SafetensorsSet& file, const Model& model, std::uint64_t seed = 0,
              const ParamSpecs* whole = nullptr);
  void get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a, float* out) override;
  std::uint64_t bytes_read() const { return bytes_read_; }  // of the file, so far
  std::uint64_t file_bytes() const;                         // the model's tensors
  // The first value read that is NaN or infinite, as an error message
  // naming the tensor and element; empty while none was. Not raised from
  // get(): a rank raising alone in the middle of load_state would leave the
  // others in its collectives; the ranks agree after it.
  const std::string& not_finite() const { return not_finite_; }

 private:
  void read_transposed(const SafetensorsSet::Tensor& t, const Shape& shape, std::uint64_t first,
                       std::uint64_t count, float* out);
  // A tensor-parallel part's elements [first, first + count), each from
  // where the whole tensor holds it, in runs of consecutive file elements.
  void read_part(ParamId p, std::uint64_t first, std::uint64_t count, float* out);
  void check_finite(ParamId p, std::uint64_t first, std::uint64_t count, const float* values);
  const SafetensorsSet& file_;
  ParamSpecs params_;
  IdVector<ParamId, SafetensorsSet::Tensor> match_;  // entry null: an adapter drawn
  std::uint64_t seed_;
  std::vector<float> segment_;
  std::uint64_t bytes_read_ = 0;
  std::string not_finite_;
};

struct WeightsImport {
  bool from_rank_0 = false;       // rank 0 sent the other ranks their ranges
  std::uint64_t bytes_read = 0;   // of the file's tensors, by this rank
  std::uint64_t file_bytes = 0;   // every tensor of the model in the file
  std::uint64_t bytes_moved = 0;  // between ranks, summed over them
  double seconds = 0;
};

// What an import fills: `load` takes the file as a state source
// (Strategy::load_state; with frozen parameters, FrozenSplit's loads too),
// and adapters the file lacks start from `seed`.
struct WeightsTarget {
  StateLoader load;
  std::uint64_t seed = 0;
  const ParamSpecs* whole = nullptr;  // as WeightsFile's
};

WeightsImport import_weights(const Model& model, const WeightsTarget& target,
                             const std::filesystem::path& in, Communicator& comm);
// Into a strategy alone.
inline WeightsImport import_weights(const Model& model, Strategy& strategy,
                                    const std::filesystem::path& in, Communicator& comm) {
  return import_weights(model, {[&](StateSource& s) { strategy.load_state(s); }}, in, comm);
}

}  // namespace ztrain
