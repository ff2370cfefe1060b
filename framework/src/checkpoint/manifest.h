// The manifest of a checkpoint: what a run needs to continue, and where
// every byte of its optimizer state lies.
//
// A checkpoint is a directory out_dir/step_<N>/ holding manifest.json and
// one file per rank of the run that wrote it (rank_<r>.bin). A rank file is
// the concatenation of the pieces that rank saved: each piece is one state
// array (master, m or v, fp32) of a run of consecutive elements of one
// parameter, its CRC-32C taken per block of kBlockElements so that a reader
// of part of a piece checks only the blocks it reads. For every array of
// every parameter the pieces tile its elements exactly (checked when the
// manifest is read), whatever layout the writing strategy had: a reader
// with another world size or strategy asks for the elements it owns and
// reads only the blocks that hold them.
//
// Besides the state: the ztrain version, the writing run's world size,
// strategy, precision and every resolved configuration key (to refuse a
// resume that changes the training), the training position (steps taken,
// applied and skipped, so the data order and the learning-rate schedule
// continue), the loss scaler, and the seeds. No random stream advances
// during training (initial values and the data order are pure functions of
// the seeds and indices), so the seeds are all the random state there is.
//
// Errors: DataError naming the manifest and what is wrong.
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "ztrain/model.h"
#include "ztrain/optimizer_state.h"

namespace ztrain {

// The loss scaler's state a checkpoint keeps (train/loss_scaler.h).
struct LossScalerState {
  double scale = 1;
  std::int64_t hysteresis = 0, iter = 0, last_overflow = -1;
};

inline constexpr int kCheckpointFormat = 1;
// 1 MiB of fp32: a partial read rounds out to at most two blocks per piece.
inline constexpr std::uint64_t kBlockElements = std::uint64_t{1} << 18;

// Where a run stands between two steps.
struct TrainingPosition {
  std::int64_t step = 0;     // optimizer steps taken (global batches read), skipped ones included
  std::int64_t applied = 0;  // not skipped: AdamW's step count and the schedule's position
  std::int64_t skipped = 0;
  LossScalerState scaler;
};

struct StatePiece {
  StateArray array = StateArray::master;
  int file = 0;                        // index into Manifest::files
  std::uint64_t first = 0, count = 0;  // elements of the parameter
  std::uint64_t offset = 0;            // bytes into the file
  std::vector<std::uint32_t> crcs;     // one per block of kBlockElements
};

struct ParamState {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<StatePiece> pieces;
  // A frozen parameter (ParamSpec::trainable false) has no state and no
  // pieces: a resume takes it from the base weights again.
  bool frozen = false;
  std::uint64_t numel() const;
};

struct RankFile {
  std::string name;
  std::uint64_t bytes = 0;
};

struct Manifest {
  std::string ztrain_version;
  int world = 1;
  std::string strategy, precision;
  std::int64_t global_batch = 0, grad_accum = 0;
  std::uint64_t seed = 0, data_seed = 0;
  TrainingPosition position;
  // Every resolved key of the writing run ("train.lr" -> its TOML value;
  // empty: unset), and the resolved config.toml itself.
  std::vector<std::pair<std::string, std::string>> config;
  std::string config_toml;
  std::vector<RankFile> files;
  IdVector<ParamId, ParamState> params;
};

std::string manifest_json(const Manifest& m);
// Parses and checks the structure: every field present and typed, the
// position consistent, pieces inside their files and tiling each array of
// each parameter.
Manifest parse_manifest(const std::string& text, const std::filesystem::path& where);
// The checks of parse_manifest on a manifest in memory (the writer checks
// what it is about to commit); `where` names it in the error.
void check_manifest(const Manifest& m, const std::string& where);

// The pieces of one rank file, as the writing rank reports them to rank 0.
std::string pieces_json(const std::vector<std::pair<ParamId, StatePiece>>& pieces);
std::vector<std::pair<ParamId, StatePiece>> parse_pieces(const std::string& text,
                                                         const std::filesystem::path& where);

}  // namespace ztrain
