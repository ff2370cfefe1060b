#include "train/checkpoint_writer.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/crc32c.h"
#include "core/durable_file.h"
#include "train/config_agreement.h"
#include "ztrain/error.h"

namespace ztrain {
namespace fs = std::filesystem;

namespace {

// The test hook's countdown: the kill point of this process's checkpoint
// of step `step`.
class CrashPoints {
 public:
  explicit CrashPoints(std::int64_t step) {
    const char* text = std::getenv("ZTRAIN_TEST_KILL_IN_CHECKPOINT");
    if (!text || !*text) return;
    long long at_step = 0, k = 0;
    int used = 0;
    if (std::sscanf(text, "%lld:%lld%n", &at_step, &k, &used) != 2 || text[used] != '\0' || k < 1)
      throw ConfigError(std::string("ZTRAIN_TEST_KILL_IN_CHECKPOINT=") + text +
                        ": expected STEP:K, e.g. 10:3");
    if (at_step == step) left_ = k;
  }
  void pass() {
    if (left_ > 0 && --left_ == 0) ::kill(::getpid(), SIGKILL);
  }

 private:
  long long left_ = 0;
};

// A rank's file: each piece appended with its block checksums.
class RankFileSink final : public StateSink {
 public:
  RankFileSink(const fs::path& path, int file, CrashPoints& crash)
      : out_(path), file_(file), crash_(crash) {}
  void put(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
           const float* values) override {
    StatePiece s{a, file_, first, count, out_.size(), {}};
    for (std::uint64_t b = 0; b < count; b += kBlockElements)
      s.crcs.push_back(crc32c(values + b, std::min(kBlockElements, count - b) * sizeof(float)));
    out_.write(values, count * sizeof(float));
    pieces_.emplace_back(p, std::move(s));
    crash_.pass();
  }
  std::uint64_t finish() {
    out_.finish();
    return out_.size();
  }
  const std::vector<std::pair<ParamId, StatePiece>>& pieces() const { return pieces_; }

 private:
  DurableFile out_;
  int file_;
  CrashPoints& crash_;
  std::vector<std::pair<ParamId, StatePiece>> pieces_;
};

std::string rank_file(int r) {
  return "rank_" + std::to_string(r) + ".bin";
}
std::string piece_list(int r) {
  return "rank_" + std::to_string(r) + ".pieces.json";
}

// This rank's file and piece list in `tmp`.
std::uint64_t write_rank_part(const fs::path& tmp, Strategy& strategy, int rank,
                              CrashPoints& crash) {
  RankFileSink sink(tmp / rank_file(rank), rank, crash);
  strategy.save_state(sink);
  const std::uint64_t bytes = sink.finish();
  crash.pass();
  write_file_atomically(tmp / piece_list(rank), pieces_json(sink.pieces()));
  crash.pass();
  return bytes;
}

// Rank 0: the manifest from every rank's list, then the directory made whole.
std::uint64_t commit(const fs::path& out_dir, const fs::path& tmp, const fs::path& dir, Manifest m,
                     const std::vector<ParamSpec>& params, int world, CrashPoints& crash) {
  m.params.resize(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    m.params[i].name = params[i].name;
    m.params[i].shape = params[i].shape.dims();
  }
  std::uint64_t bytes = 0;
  for (int r = 0; r < world; ++r) {
    const fs::path list = tmp / piece_list(r);
    for (auto& [p, s] : parse_pieces(read_whole_file(list), list)) {
      if (p < 0 || static_cast<std::size_t>(p) >= params.size())
        throw InternalError("checkpoint: rank " + std::to_string(r) + " put parameter " +
                            std::to_string(p));
      m.params[static_cast<std::size_t>(p)].pieces.push_back(std::move(s));
    }
    const std::uint64_t size = fs::file_size(tmp / rank_file(r));
    m.files.push_back({rank_file(r), size});
    bytes += size;
  }
  check_manifest(m, (tmp / "manifest.json").string());  // every element saved exactly once
  write_file_atomically(tmp / "manifest.json", manifest_json(m));
  for (int r = 0; r < world; ++r) fs::remove(tmp / piece_list(r));
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

// Removes all but the keep_last newest checkpoints (0 keeps all), and the
// temporary directories that killed attempts left.
void prune(const fs::path& out_dir, std::int64_t keep_last) {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  for (const auto& e : fs::directory_iterator(out_dir)) {
    if (!e.is_directory()) continue;
    if (checkpoint_step(e.path()) >= 0)
      found.emplace_back(checkpoint_step(e.path()), e.path());
    else if (is_checkpoint_dir(e.path()) && e.path().extension() == ".tmp")
      fs::remove_all(e.path());
  }
  if (keep_last <= 0) return;
  std::sort(found.rbegin(), found.rend());
  for (std::size_t i = static_cast<std::size_t>(keep_last); i < found.size(); ++i)
    fs::remove_all(found[i].second);
}

}  // namespace

std::string checkpoint_name(std::int64_t step) {
  return "step_" + std::to_string(step);
}

std::int64_t checkpoint_step(const fs::path& dir) {
  const std::string n = dir.filename().string();
  if (n.rfind("step_", 0) != 0 || n.size() == 5 || n.size() > 20) return -1;
  std::int64_t s = 0;
  for (std::size_t i = 5; i < n.size(); ++i) {
    if (n[i] < '0' || n[i] > '9') return -1;
    s = s * 10 + (n[i] - '0');
  }
  return s;
}

bool is_checkpoint_dir(const fs::path& dir) {
  std::string n = dir.filename().string();
  for (const char* suffix : {".tmp", ".replaced"}) {
    const std::string x(suffix);
    if (n.size() > x.size() && n.compare(n.size() - x.size(), x.size(), x) == 0)
      n.resize(n.size() - x.size());
  }
  return checkpoint_step(fs::path(n)) >= 0;
}

CheckpointWritten write_checkpoint(const fs::path& out_dir, std::int64_t keep_last, Manifest header,
                                   const std::vector<ParamSpec>& params, Strategy& strategy,
                                   Communicator& comm) {
  const auto t0 = std::chrono::steady_clock::now();
  const int rank = comm.rank(), world = comm.size();
  CrashPoints crash(header.position.step);
  const fs::path dir = out_dir / checkpoint_name(header.position.step);
  const fs::path tmp = dir.string() + ".tmp";
  // Whatever remains of the temporary directory goes: nothing after a
  // commit, the partial files after a failure (a full disk).
  struct RemoveTmp {
    const fs::path& tmp;
    bool lead;
    ~RemoveTmp() {
      std::error_code ignored;
      if (lead) fs::remove_all(tmp, ignored);
    }
  } cleanup{tmp, rank == 0};
  std::string why;
  if (rank == 0) {
    try {
      fs::remove_all(tmp);  // an earlier attempt's, never read
      fs::create_directories(tmp);
      crash.pass();
    } catch (const std::exception& e) {
      why = "cannot make checkpoint directory '" + tmp.string() + "': " + e.what();
    }
  }
  stop_together<DataError>(
      why, "making the checkpoint directory failed on another rank (its error is above)", comm);
  std::uint64_t bytes = 0;
  try {
    write_rank_part(tmp, strategy, rank, crash);
  } catch (const std::exception& e) {
    why =
        std::string("checkpoint of step ") + std::to_string(header.position.step) + ": " + e.what();
  }
  stop_together<DataError>(
      why, "writing a checkpoint file failed on another rank (its error is above)", comm);
  if (rank == 0) {
    try {
      bytes = commit(out_dir, tmp, dir, std::move(header), params, world, crash);
      prune(out_dir, keep_last);
      crash.pass();
    } catch (const std::exception& e) {
      why = std::string("checkpoint '") + dir.string() + "': " + e.what();
    }
  }
  stop_together<DataError>(
      why, "completing the checkpoint failed on another rank (its error is above)", comm);
  return {dir, bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

}  // namespace ztrain
