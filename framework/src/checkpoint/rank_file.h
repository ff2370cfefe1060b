// One rank's part of a checkpoint: its file of state pieces and the list
// of those pieces, and the test hook that kills a checkpoint half-way.
//
// RankStateFile is the StateSink a strategy saves into. While the snapshot
// allowance lasts, put() copies each piece into host memory (tier host,
// category checkpoint, so the copy is in the run's accounting and budget),
// taken from SnapshotBuffers, and returns; write() later puts the copies into the file, on a
// background thread while training goes on. A piece past the allowance (an
// NVMe strategy's state that host memory cannot hold, or a host budget
// reached) ends the snapshot: what was copied is written at once, then
// that piece and the rest go straight to the file, and the checkpoint is
// written within the step as without a snapshot. Every piece gets its
// offset in the file when it is put, so the file's layout is the same
// either way.
//
// CrashPoints: a test's CheckpointKill (io/fault_plan.h) kills the process
// (SIGKILL) at the K-th point of the checkpoint of its step (a point: the
// directory made, each piece written, the file synced, its piece list, the
// manifest, the rename, `latest`, the pruning), on every rank or one.
//
// SnapshotBuffers keeps a checkpoint's copies for the next one: a strategy
// saves the same pieces in the same sizes every time, and memory that
// stays allocated is not faulted in again (fresh pages cost 2.3-2.5 s for
// gpt2-124m's 1.48 GB on this project's VMs, whose freed memory returns to
// the host; reused ones 0.21 s: bench/RESULTS.md). The kept copies stay in
// the host tier's accounting between checkpoints.
//
// Errors: DataError naming the file and the system's reason.
// Thread safety: put() on the training thread; write() on one thread
// after the last put(); release() on the training thread after write();
// SnapshotBuffers on the training thread only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include "checkpoint/manifest.h"
#include "io/durable_file.h"
#include "io/fault_plan.h"
#include "ztrain/device.h"
#include "ztrain/optimizer_state.h"

namespace ztrain {

class CrashPoints {
 public:
  CrashPoints(const CheckpointKill& kill, std::int64_t step, int rank);
  void pass();

 private:
  long long left_ = 0;
};

class SnapshotBuffers {
 public:
  explicit SnapshotBuffers(Device& device) : device_(device) {}
  // A kept buffer of exactly `bytes`, else a new one (OutOfMemoryError
  // past the host budget).
  Buffer take(std::size_t bytes);
  void keep(Buffer b);
  std::uint64_t kept_bytes() const { return kept_bytes_; }

 private:
  Device& device_;
  std::multimap<std::size_t, Buffer> kept_;
  std::uint64_t kept_bytes_ = 0;
};

class RankStateFile final : public StateSink {
 public:
  // `snapshot_allowance`: the bytes put() may copy (0: none, every piece
  // is written as it is put).
  RankStateFile(const std::filesystem::path& dir, int rank, SnapshotBuffers& buffers,
                std::uint64_t snapshot_allowance, CrashPoints& crash);

  void put(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
           const float* values) override;
  // Writes the copied pieces, syncs the file and writes the piece list.
  void write();
  // Gives the copies back to the SnapshotBuffers.
  void release();

  // Whether every piece so far was copied (none written yet).
  bool snapshot_whole() const { return !spilled_; }
  std::uint64_t bytes_held() const { return held_bytes_; }

 private:
  struct Held {
    std::size_t piece;  // index in pieces_
    Buffer copy;
  };
  void write_piece(std::size_t piece, const float* values);
  void spill();

  std::filesystem::path list_path_;
  DurableFile out_;
  int rank_;
  SnapshotBuffers& buffers_;
  std::uint64_t allowance_;
  CrashPoints& crash_;
  bool spilled_ = false;
  std::uint64_t offset_ = 0, held_bytes_ = 0;
  std::vector<std::pair<ParamId, StatePiece>> pieces_;
  std::vector<Held> held_;
};

// "rank_<r>.bin" and the list of its pieces, "rank_<r>.pieces.json".
std::string rank_file_name(int r);
std::string piece_list_name(int r);

}  // namespace ztrain
