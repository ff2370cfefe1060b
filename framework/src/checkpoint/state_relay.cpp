// The ranges are all-gathered, so every rank knows the same plan of
// rounds. In a round each rank r > 0 receives the next up to
// kRoundElements / (world - 1) elements of its ranges through one
// reduce-scatter: rank 0 gives the values, every other rank gives -0.0,
// which added to any value leaves its bits as they are (+0.0 would turn a
// -0.0 weight into +0.0); the Communicator has no point-to-point send.
#include "checkpoint/state_relay.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/host_name.h"
#include "io/fd_io.h"
#include "job/rank_agreement.h"
#include "ztrain/error.h"

namespace ztrain {
namespace fs = std::filesystem;

namespace {

// One range a strategy asked for.
struct Range {
  std::uint64_t param, first, count, array;
};

// The first load_state: records the ranges that travel, fills zeros.
class RangeRecorder final : public StateSource {
 public:
  explicit RangeRecorder(bool master_only) : master_only_(master_only) {}
  void get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a, float* out) override {
    std::fill(out, out + count, 0.0f);
    if (!master_only_ || a == StateArray::master)
      ranges.push_back({index_of(p), first, count, static_cast<std::uint64_t>(a)});
  }
  std::vector<Range> ranges;

 private:
  bool master_only_;
};

// An anonymous file in TMPDIR (unlinked at once: it goes when closed,
// however the process ends) that keeps what a rank receives.
class ScratchFile {
 public:
  explicit ScratchFile(std::string what) : what_(std::move(what)), dir_(fs::temp_directory_path()) {
    std::string path = (dir_ / "ztrain-state-XXXXXX").string();
    fd_ = ::mkstemp(path.data());
    if (fd_ < 0) fail("cannot create a scratch file", errno);
    ::unlink(path.c_str());
  }
  ~ScratchFile() { ::close(fd_); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  void append(const float* values, std::size_t n) {
    if (const int e = write_all(fd_, values, n * sizeof(float)))
      fail("cannot keep the state rank 0 sent", e);
  }
  // n floats from element `at`.
  void read(std::uint64_t at, std::size_t n, float* out) const {
    if (const int e = read_at(fd_, out, n * sizeof(float), at * sizeof(float)))
      fail("cannot read back the state rank 0 sent", e == kEndOfFile ? EIO : e);
  }

 private:
  [[noreturn]] void fail(const std::string& what, int error) const {
    throw DataError(what_ + ": " + what + " in a scratch file in " + dir_.string() + " (" +
                    std::strerror(error) + " on host " + host_name() +
                    "); set TMPDIR to a file system with room for this rank's share of the "
                    "state");
  }
  std::string what_;
  fs::path dir_;
  int fd_ = -1;
};

// The second load_state of a rank that received its ranges: they come, in
// the order recorded, from its scratch file; the rest is zero.
class ReceivedState final : public StateSource {
 public:
  ReceivedState(const ScratchFile& file, const std::vector<Range>& ranges, bool master_only,
                std::string what)
      : file_(file), ranges_(ranges), master_only_(master_only), what_(std::move(what)) {}
  void get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a, float* out) override {
    if (master_only_ && a != StateArray::master) return std::fill(out, out + count, 0.0f);
    const bool same = next_ < ranges_.size() && ranges_[next_].param == index_of(p) &&
                      ranges_[next_].first == first && ranges_[next_].count == count &&
                      ranges_[next_].array == static_cast<std::uint64_t>(a);
    if (!same)
      throw InternalError(what_ + ": the strategy's load_state asked for parameter " +
                          to_string(p) + "'s " + std::string(state_array_name(a)) + " elements [" +
                          std::to_string(first) + ", +" + std::to_string(count) +
                          ") where its first pass asked for another range; a strategy must ask "
                          "for the same ranges in the same order every time");
    file_.read(at_, static_cast<std::size_t>(count), out);
    at_ += count;
    ++next_;
  }

 private:
  const ScratchFile& file_;
  const std::vector<Range>& ranges_;
  bool master_only_;
  std::string what_;
  std::size_t next_ = 0;
  std::uint64_t at_ = 0;
};

// Every rank's ranges, on every rank.
std::vector<std::vector<Range>> all_ranges(const std::vector<Range>& mine, Communicator& comm) {
  std::string bytes(mine.size() * sizeof(Range), '\0');
  if (!mine.empty()) std::memcpy(bytes.data(), mine.data(), bytes.size());
  std::vector<std::vector<Range>> ranges;
  for (const std::string& text : every_rank_text(bytes, comm)) {
    std::vector<Range>& r = ranges.emplace_back(text.size() / sizeof(Range));
    if (!r.empty()) std::memcpy(r.data(), text.data(), text.size());
  }
  return ranges;
}

// Where a rank's stream of ranges stands: elements are taken in order,
// across range boundaries.
struct Cursor {
  const std::vector<Range>* ranges;
  std::size_t index = 0;
  std::uint64_t offset = 0;  // within ranges[index]
  std::uint64_t left = 0;    // elements still to send

  // The next n elements, read from `source` (rank 0), or skipped.
  void take(std::uint64_t n, StateSource* source, float* out) {
    left -= n;
    while (n > 0) {
      const Range& r = (*ranges)[index];
      const std::uint64_t k = std::min(n, r.count - offset);
      if (source)
        source->get(id_at<ParamId>(r.param), r.first + offset, k, static_cast<StateArray>(r.array),
                    out);
      out += k;
      n -= k;
      offset += k;
      if (offset == r.count) {
        ++index;
        offset = 0;
      }
    }
  }
};

// Rounds are cut to this many elements (64 MiB of fp32) over all ranks,
// so the send buffer each rank allocates for a round stays small.
constexpr std::uint64_t kRoundElements = std::uint64_t{16} << 20;

// Sends each rank r > 0 the values of ranges[r], rank 0 reading them from
// `source`; each rank appends its own to `scratch`.
void relay(const std::vector<std::vector<Range>>& ranges, StateSource* source, ScratchFile* scratch,
           Communicator& comm) {
  const auto world = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  std::vector<Cursor> cursors(world);
  for (std::size_t r = 1; r < world; ++r) {
    cursors[r].ranges = &ranges[r];
    for (const Range& x : ranges[r]) cursors[r].left += x.count;
  }
  const std::uint64_t share = std::max<std::uint64_t>(1, kRoundElements / (world - 1));
  std::vector<float> send, received;
  for (;;) {
    std::vector<std::size_t> counts(world, 0);
    std::size_t total = 0;
    for (std::size_t r = 1; r < world; ++r) {
      counts[r] = static_cast<std::size_t>(std::min(cursors[r].left, share));
      total += counts[r];
    }
    if (total == 0) return;
    send.assign(total, -0.0f);
    float* at = send.data();
    for (std::size_t r = 1; r < world; ++r) {
      cursors[r].take(counts[r], me == 0 ? source : nullptr, at);
      at += counts[r];
    }
    received.resize(counts[me]);
    comm.reduce_scatter_v_async(send.data(), received.data(), counts, DType::f32, ReduceOp::sum)
        .wait();
    if (me != 0) scratch->append(received.data(), received.size());
  }
}

}  // namespace

std::uint64_t load_through_rank_0(const StateLoader& load, StateSource* source, bool master_only,
                                  const std::string& what, Communicator& comm) {
  RangeRecorder recorder(master_only);
  load(recorder);
  const CommCounters mark = comm.counters();  // the relay's bytes, not load_state's
  const auto ranges = all_ranges(comm.rank() == 0 ? std::vector<Range>{} : recorder.ranges, comm);
  std::optional<ScratchFile> scratch;
  std::string scratch_error;
  try {
    if (comm.rank() != 0) scratch.emplace(what);
  } catch (const DataError& e) {
    scratch_error = e.what();
  }
  stop_together<DataError>(
      scratch_error, what + ": another rank cannot keep its state (its error is above)", comm);
  relay(ranges, source, scratch ? &*scratch : nullptr, comm);
  // Every rank's bytes sent, summed over the ranks.
  float moved = static_cast<float>(comm.counters().since(mark).total_bytes());
  comm.all_reduce(&moved, 1, DType::f32, ReduceOp::sum);
  if (comm.rank() == 0) {
    load(*source);
  } else {
    ReceivedState received(*scratch, recorder.ranges, master_only, what);
    load(received);
  }
  return static_cast<std::uint64_t>(moved);
}

}  // namespace ztrain
