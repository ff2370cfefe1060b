#include "checkpoint/rank_file.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "io/crc32c.h"
#include "ztrain/error.h"

namespace ztrain {

CrashPoints::CrashPoints(const CheckpointKill& kill, std::int64_t step, int rank) {
  if (kill.applies(step, rank)) left_ = kill.point;
}

void CrashPoints::pass() {
  if (left_ > 0 && --left_ == 0) ::kill(::getpid(), SIGKILL);
}

std::string rank_file_name(int r) {
  return "rank_" + std::to_string(r) + ".bin";
}

std::string piece_list_name(int r) {
  return "rank_" + std::to_string(r) + ".pieces.json";
}

Buffer SnapshotBuffers::take(std::size_t bytes) {
  const auto it = kept_.find(bytes);
  if (it == kept_.end())
    return device_.allocate(Tier::host, Category::checkpoint, bytes, Fill::undefined);
  Buffer b = std::move(it->second);
  kept_.erase(it);
  kept_bytes_ -= bytes;
  return b;
}

void SnapshotBuffers::keep(Buffer b) {
  if (!b) return;
  kept_bytes_ += b.bytes();
  kept_.emplace(b.bytes(), std::move(b));
}

RankStateFile::RankStateFile(const std::filesystem::path& dir, int rank, SnapshotBuffers& buffers,
                             std::uint64_t snapshot_allowance, CrashPoints& crash)
    : list_path_(dir / piece_list_name(rank)),
      out_(dir / rank_file_name(rank)),
      rank_(rank),
      buffers_(buffers),
      allowance_(snapshot_allowance),
      crash_(crash) {}

void RankStateFile::put(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
                        const float* values) {
  const std::uint64_t bytes = count * sizeof(float);
  pieces_.emplace_back(p, StatePiece{a, rank_, first, count, offset_, {}});
  offset_ += bytes;
  const std::size_t piece = pieces_.size() - 1;
  if (!spilled_ && held_bytes_ + bytes <= allowance_) {
    try {
      Buffer copy = buffers_.take(bytes);
      if (bytes) std::memcpy(copy.data(), values, bytes);
      held_bytes_ += bytes;
      held_.push_back({piece, std::move(copy)});
      return;
    } catch (const OutOfMemoryError&) {
      // The host budget ends the snapshot as the allowance does.
    }
  }
  spill();
  write_piece(piece, values);
}

// The copies so far into the file; from now on pieces are written as put.
void RankStateFile::spill() {
  if (spilled_) return;
  spilled_ = true;
  for (Held& h : held_) write_piece(h.piece, h.copy.as<const float>());
  release();
}

void RankStateFile::write_piece(std::size_t piece, const float* values) {
  // Block by block, so that write() copies each block while its checksum
  // has just brought it into the cache.
  StatePiece& s = pieces_[piece].second;
  for (std::uint64_t b = 0; b < s.count; b += kBlockElements) {
    const std::uint64_t bytes = std::min(kBlockElements, s.count - b) * sizeof(float);
    s.crcs.push_back(crc32c(values + b, bytes));
    out_.write(values + b, bytes);
  }
  crash_.pass();
}

void RankStateFile::release() {
  for (Held& h : held_) buffers_.keep(std::move(h.copy));
  held_.clear();
  held_bytes_ = 0;
}

void RankStateFile::write() {
  if (!spilled_)
    for (const Held& h : held_) write_piece(h.piece, h.copy.as<const float>());
  out_.finish();
  crash_.pass();
  write_file_atomically(list_path_, pieces_json(pieces_));
  crash_.pass();
}

}  // namespace ztrain
