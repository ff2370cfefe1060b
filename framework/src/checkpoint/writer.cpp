#include "checkpoint/writer.h"

#include <algorithm>
#include <chrono>

#include "checkpoint/read_lock.h"
#include "checkpoint/tensor_parts.h"
#include "checkpoint/weights.h"
#include "io/durable_file.h"
#include "job/rank_agreement.h"
#include "ztrain/error.h"

namespace ztrain {
namespace fs = std::filesystem;

namespace {

// Rank 0: the manifest from every rank's list, then the directory made whole.
std::uint64_t commit(const fs::path& out_dir, const fs::path& tmp, const fs::path& dir, Manifest m,
                     const ParamSpecs& params, int world, CrashPoints& crash) {
  m.params.resize(params.size());
  for (ParamId p : params.ids()) {
    m.params[p].name = params[p].name;
    m.params[p].shape = params[p].shape.dims();
    m.params[p].frozen = !params[p].trainable;
  }
  std::uint64_t bytes = 0;
  for (int r = 0; r < world; ++r) {
    const fs::path list = tmp / piece_list_name(r);
    for (auto& [p, s] : parse_pieces(read_whole_file(list), list)) {
      if (!m.params.contains(p))
        throw InternalError("checkpoint: rank " + std::to_string(r) + " put parameter " +
                            to_string(p));
      m.params[p].pieces.push_back(std::move(s));
    }
    const std::uint64_t size = fs::file_size(tmp / rank_file_name(r));
    m.files.push_back({rank_file_name(r), size});
    bytes += size;
  }
  check_manifest(m, (tmp / "manifest.json").string());  // every element saved exactly once
  write_file_atomically(tmp / "manifest.json", manifest_json(m));
  for (int r = 0; r < world; ++r) fs::remove(tmp / piece_list_name(r));
  sync_directory(tmp);
  crash.pass();
  // A checkpoint of this step from an earlier attempt (a resume from an
  // older one) gives way only once the new one is whole.
  const fs::path old = dir.string() + ".replaced";
  if (fs::exists(dir)) {
    fs::remove_all(old);
    rename_durably(dir, old);
  }
  rename_durably(tmp, dir);
  crash.pass();
  write_file_atomically(out_dir / "latest", dir.filename().string() + "\n");
  crash.pass();
  fs::remove_all(old);
  return bytes;
}

}  // namespace

void CheckpointPruner::prune(const fs::path& out_dir, std::int64_t keep_last) {
  if (remover_.joinable()) remover_.join();
  if (!error_.empty())
    throw DataError("cannot remove the old checkpoint " + error_ +
                    "; free its file system or remove it by hand");
  std::vector<std::pair<std::int64_t, fs::path>> kept;
  std::vector<fs::path> doomed;
  for (const auto& e : fs::directory_iterator(out_dir)) {
    if (!e.is_directory()) continue;
    if (checkpoint_step(e.path()) >= 0)
      kept.emplace_back(checkpoint_step(e.path()), e.path());
    else if (is_checkpoint_dir(e.path()) && e.path().extension() != ".replaced")
      doomed.push_back(e.path());  // a killed attempt's .tmp, an unfinished .removing
  }
  std::sort(kept.rbegin(), kept.rend());
  for (std::size_t i = static_cast<std::size_t>(keep_last); keep_last > 0 && i < kept.size(); ++i) {
    // One another process is reading stays for a later prune.
    const CheckpointRemoval removal(kept[i].second);
    if (!removal.free()) continue;
    const fs::path gone = kept[i].second.string() + ".removing";
    fs::remove_all(gone);  // a killed run's, of the same step
    fs::rename(kept[i].second, gone);
    doomed.push_back(gone);
  }
  if (doomed.empty()) return;
  remover_ = std::jthread([this, doomed] {
    for (const fs::path& p : doomed) {
      std::error_code ec;
      fs::remove_all(p, ec);
      if (ec && error_.empty()) error_ = "'" + p.string() + "': " + ec.message();
    }
  });
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

CheckpointWrite::CheckpointWrite(const CheckpointTarget& target, Manifest header, ParamSpecs params,
                                 Strategy& strategy, SnapshotBuffers& buffers,
                                 CheckpointPruner& pruner, Communicator& comm)
    : target_(target),
      header_(std::move(header)),
      params_(std::move(params)),
      pruner_(pruner),
      comm_(comm),
      dir_(target.out_dir / checkpoint_name(header_.position.step)),
      tmp_(dir_.string() + ".tmp"),
      tmp_guard_{tmp_, comm.rank() == 0},
      t0_(std::chrono::steady_clock::now()),
      crash_(target_.kill, header_.position.step, comm.rank()) {
  make_directory();
  save_state(strategy, buffers);
  copy_s_ = seconds_since(t0_);
}

CheckpointWrite::TmpGuard::~TmpGuard() {
  std::error_code ignored;
  if (lead && !committed) fs::remove_all(dir, ignored);
}

void CheckpointWrite::make_directory() {
  std::string why;
  if (comm_.rank() == 0) {
    try {
      fs::remove_all(tmp_);  // an earlier attempt's, never read
      fs::create_directories(tmp_);
      crash_.pass();
    } catch (const std::exception& e) {
      why = "cannot make checkpoint directory '" + tmp_.string() + "': " + e.what();
    }
  }
  stop_together<DataError>(
      why, "making the checkpoint directory failed on another rank (its error is above)", comm_);
}

// The state into this rank's file: copied, then written by the background
// thread; or written here when it could not all be copied.
void CheckpointWrite::save_state(Strategy& strategy, SnapshotBuffers& buffers) {
  const std::string what = "checkpoint of step " + std::to_string(header_.position.step) + ": ";
  std::string why;
  try {
    file_ = std::make_unique<RankStateFile>(tmp_, comm_.rank(), buffers, target_.snapshot_allowance,
                                            crash_);
    WholeSink whole(*file_, params_, target_.tensor_rank);
    strategy.save_state(whole);
    background_ = file_->snapshot_whole() && target_.snapshot_allowance > 0;
    if (!background_) {
      file_->write();
      done_.store(true, std::memory_order_release);
    }
  } catch (const std::exception& e) {
    why = what + e.what();
  }
  stop_together<DataError>(
      why, "writing a checkpoint file failed on another rank (its error is above)", comm_);
  // Whether any rank writes in the background: without one, the commit
  // need not wait for the next step's agreement to learn that every
  // rank is done.
  float writing = background_ ? 1.0f : 0.0f;
  comm_.all_reduce(&writing, 1, DType::f32, ReduceOp::sum);
  written_in_step_ = writing == 0.0f;
  if (!background_) return;
  writer_ = std::jthread([this, what] {
    try {
      file_->write();
    } catch (const std::exception& e) {
      error_ = what + e.what();
    }
    done_.store(true, std::memory_order_release);
  });
}

CheckpointWritten CheckpointWrite::finish() {
  const auto t_finish = std::chrono::steady_clock::now();
  if (writer_.joinable()) writer_.join();
  file_->release();
  stop_together<DataError>(
      error_, "writing a checkpoint file failed on another rank (its error is above)", comm_);
  std::string why;
  std::uint64_t bytes = 0;
  if (comm_.rank() == 0) {
    try {
      const ParamSpecs& listed = target_.model_params.empty() ? params_ : target_.model_params;
      bytes = commit(target_.out_dir, tmp_, dir_, std::move(header_), whole_specs(listed),
                     comm_.size(), crash_);
      tmp_guard_.committed = true;
      pruner_.prune(target_.out_dir, target_.keep_last);
      crash_.pass();
    } catch (const std::exception& e) {
      why = std::string("checkpoint '") + dir_.string() + "': " + e.what();
    }
  }
  stop_together<DataError>(
      why, "completing the checkpoint failed on another rank (its error is above)", comm_);
  const double commit_s = seconds_since(t_finish);
  return {dir_, bytes, seconds_since(t0_), copy_s_ + commit_s, copy_s_, commit_s, background_};
}

}  // namespace ztrain
