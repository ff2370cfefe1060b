// Reading a checkpoint: its manifest checked against the files and the
// model, and its state handed to a strategy range by range.
//
// locate() finds the checkpoint a path names: a checkpoint directory
// (holding manifest.json), or a run directory whose `latest` names one.
// Opening takes the checkpoint's read lock (checkpoint/read_lock.h: no
// pruner removes it while the Checkpoint lives), reads the manifest and
// checks every rank file exists with the size the manifest gives (a
// missing or truncated file is named). open() does both, and when the
// checkpoint `latest` named was pruned before it could be locked (a run
// still training there), reads `latest` again. A
// CheckpointSource answers a strategy's load_state: for each range asked it
// reads the blocks of the pieces that hold it, checks their checksums and
// copies the elements out, so a rank reads the state it now owns, rounded
// out to whole 1 MiB blocks, and nothing else. verify() reads and checks
// every block (`ztrain checkpoint info`).
//
// Errors: DataError naming the file, and for a bad checksum the parameter,
// array and byte range.
// Thread safety: a Checkpoint is immutable after opening; a source is used
// by one thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/read_lock.h"
#include "ztrain/mapped_file.h"
#include "ztrain/model.h"
#include "ztrain/optimizer_state.h"

namespace ztrain {

class ReadAhead;

class Checkpoint {
 public:
  static std::filesystem::path locate(const std::filesystem::path& path);
  static Checkpoint open(const std::filesystem::path& path);
  explicit Checkpoint(const std::filesystem::path& dir);

  const Manifest& manifest() const { return manifest_; }
  const std::filesystem::path& dir() const { return dir_; }
  // The model of this run has the checkpoint's parameters: names and shapes.
  void check_model(const ParamSpecs& params) const;
  // Reads every block of every piece and checks it; returns the bytes read.
  std::uint64_t verify() const;

 private:
  CheckpointReadLock lock_;  // first: the manifest is read under it
  std::filesystem::path dir_;
  Manifest manifest_;
};

class CheckpointSource final : public StateSource {
 public:
  explicit CheckpointSource(const Checkpoint& checkpoint);
  ~CheckpointSource() override;
  CheckpointSource(const CheckpointSource&) = delete;
  CheckpointSource& operator=(const CheckpointSource&) = delete;

  void get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a, float* out) override;
  // Whole blocks of piece `s` of parameter `p` from block b0 to b1 (exclusive), checked.
  void read_blocks(ParamId p, const StatePiece& s, std::uint64_t b0, std::uint64_t b1, float* out);
  std::uint64_t bytes_read() const { return bytes_read_; }
  // Spent in get(): reading and checking.
  double seconds() const { return seconds_; }

 private:
  // Each rank file is opened on first use: a descriptor for reads from
  // disk, a mapping for copies from the page cache.
  std::filesystem::path path(int file) const;
  int fd(int file);
  const MappedFile& map(int file);

  const Checkpoint& checkpoint_;
  std::vector<int> fds_;
  std::vector<std::optional<MappedFile>> maps_;
  std::vector<bool> cached_;                       // wholly in the page cache when mapped
  std::vector<std::unique_ptr<ReadAhead>> ahead_;  // per file not cached
  std::vector<float> blocks_;
  std::uint64_t bytes_read_ = 0;
  double seconds_ = 0;
};

}  // namespace ztrain
