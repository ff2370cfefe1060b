// When some rank cannot see the file, the ranks run load_state twice. The
// first time the source only records the master ranges each rank's
// strategy asks for (filling zeros); the lists are all-gathered, so every
// rank knows the same plan of rounds. In a round each rank r > 0 receives
// the next up to kRoundElements / (world - 1) elements of its ranges
// through one reduce-scatter: rank 0 gives the values, every other rank
// gives -0.0, which added to any value leaves its bits as they are (+0.0
// would turn a -0.0 weight into +0.0). Each rank appends what it receives
// to an anonymous scratch file; the second load_state reads it back,
// checking that the strategy asks for the same ranges in the same order.
#include "train/weights_import.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>

#include "train/rank_agreement.h"
#include "train/weights.h"
#include "ztrain/error.h"

namespace ztrain {
namespace fs = std::filesystem;

namespace {

// The file's tensor for every parameter of `model`, matched by its Hugging
// Face name (else its own) and shape; DataError listing every difference.
std::vector<const SafetensorsEntry*> match_params(const SafetensorsReader& file,
                                                  const Model& model) {
  const auto params = model.params();
  std::vector<std::string> missing, unexpected, misshaped;
  std::vector<bool> used(file.entries().size(), false);
  std::vector<const SafetensorsEntry*> match(params.size(), nullptr);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    const SafetensorsEntry* e = file.find(external_name(p));
    if (!e) e = file.find(p.name);
    if (!e) {
      missing.push_back(external_name(p) + " " + external_shape(p).str());
      continue;
    }
    used[static_cast<std::size_t>(e - file.entries().data())] = true;
    if (e->shape != external_shape(p)) {
      misshaped.push_back(e->name + ": shape " + e->shape.str() + " in the file, " +
                          external_shape(p).str() + " expected" +
                          (p.hf_transposed ? " (Hugging Face Conv1D layout: in, out)" : ""));
      continue;
    }
    match[i] = e;
  }
  for (std::size_t j = 0; j < file.entries().size(); ++j)
    if (!used[j] && !model.ignorable_tensor(file.entries()[j].name))
      unexpected.push_back(file.entries()[j].name + " " + file.entries()[j].shape.str());
  const std::size_t differences = missing.size() + unexpected.size() + misshaped.size();
  if (differences > 0) {
    std::string list;
    auto section = [&](const char* title, const std::vector<std::string>& items) {
      if (items.empty()) return;
      list += "\n  " + std::to_string(items.size()) + " " + title + ":";
      const std::size_t shown = std::min<std::size_t>(items.size(), 8);
      for (std::size_t i = 0; i < shown; ++i) list += "\n    " + items[i];
      if (shown < items.size())
        list += "\n    ... and " + std::to_string(items.size() - shown) + " more";
    };
    section("missing from the file", missing);
    section("unexpected in the file", unexpected);
    section("with another shape", misshaped);
    throw DataError(file.path().string() + ": does not match the " + model.info().arch +
                    " model of this run (" + std::to_string(differences) + " differences):" + list +
                    "\ncheck [model] arch, n_layer, n_embd, n_head, vocab_size and seq_len");
  }
  return match;
}

// One master range a strategy asked for.
struct Range {
  std::uint64_t param, first, count;
};

// The first load_state: records the master ranges, fills zeros.
class RangeRecorder final : public StateSource {
 public:
  void get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a, float* out) override {
    std::fill(out, out + count, 0.0f);
    if (a == StateArray::master) ranges.push_back({static_cast<std::uint64_t>(p), first, count});
  }
  std::vector<Range> ranges;
};

// An anonymous file in TMPDIR (unlinked at once: it goes when closed,
// however the process ends) that keeps what a rank receives.
class ScratchFile {
 public:
  ScratchFile() : dir_(fs::temp_directory_path()) {
    std::string path = (dir_ / "ztrain-weights-XXXXXX").string();
    fd_ = ::mkstemp(path.data());
    if (fd_ < 0) fail("cannot create a scratch file");
    ::unlink(path.c_str());
  }
  ~ScratchFile() { ::close(fd_); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  void append(const float* values, std::size_t n) {
    const char* p = reinterpret_cast<const char*>(values);
    for (std::size_t left = n * sizeof(float); left > 0;) {
      const ssize_t w = ::write(fd_, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("cannot keep the weights rank 0 sent");
      p += w;
      left -= static_cast<std::size_t>(w);
    }
  }
  // n floats from element `at`.
  void read(std::uint64_t at, std::size_t n, float* out) const {
    char* p = reinterpret_cast<char*>(out);
    auto offset = static_cast<off_t>(at * sizeof(float));
    for (std::size_t left = n * sizeof(float); left > 0;) {
      const ssize_t r = ::pread(fd_, p, left, offset);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) fail("cannot read back the weights rank 0 sent");
      p += r;
      offset += r;
      left -= static_cast<std::size_t>(r);
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw DataError("init_from: " + what + " in a scratch file in " + dir_.string() + " (" +
                    std::strerror(errno ? errno : EIO) + " on host " + host_name() +
                    "); set TMPDIR to a file system with room for this rank's share of the "
                    "weights");
  }
  fs::path dir_;
  int fd_ = -1;
};

// The second load_state of a rank without the file: the ranges it
// recorded, in order, from its scratch file.
class ReceivedWeights final : public StateSource {
 public:
  ReceivedWeights(const ScratchFile& file, const std::vector<Range>& ranges)
      : file_(file), ranges_(ranges) {}
  void get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a, float* out) override {
    if (a != StateArray::master) return std::fill(out, out + count, 0.0f);
    const bool same = next_ < ranges_.size() &&
                      ranges_[next_].param == static_cast<std::uint64_t>(p) &&
                      ranges_[next_].first == first && ranges_[next_].count == count;
    if (!same)
      throw InternalError("init_from: the strategy's load_state asked for parameter " +
                          std::to_string(p) + " elements [" + std::to_string(first) + ", +" +
                          std::to_string(count) +
                          ") where its first pass asked for another range; a strategy must ask "
                          "for the same ranges in the same order every time");
    file_.read(at_, static_cast<std::size_t>(count), out);
    at_ += count;
    ++next_;
  }

 private:
  const ScratchFile& file_;
  const std::vector<Range>& ranges_;
  std::size_t next_ = 0;
  std::uint64_t at_ = 0;
};

// Every rank's ranges (each travels as the bits of fp32 elements, which an
// all-gather copies untouched).
std::vector<std::vector<Range>> all_ranges(const std::vector<Range>& mine, Communicator& comm) {
  static_assert(sizeof(Range) == 6 * sizeof(float));
  const auto world = static_cast<std::size_t>(comm.size());
  std::uint64_t n = mine.size();
  float packed[2];
  std::memcpy(packed, &n, sizeof n);
  std::vector<float> lengths(2 * world);
  comm.all_gather(packed, lengths.data(), 2, DType::f32);
  std::vector<std::size_t> counts(world);
  for (std::size_t r = 0; r < world; ++r) {
    std::memcpy(&n, &lengths[2 * r], sizeof n);
    counts[r] = static_cast<std::size_t>(n) * 6;
  }
  std::size_t total = 0;
  for (const std::size_t c : counts) total += c;
  std::vector<float> send(mine.size() * 6), all(total);
  if (!mine.empty()) std::memcpy(send.data(), mine.data(), mine.size() * sizeof(Range));
  comm.all_gather_v_async(send.data(), all.data(), counts, DType::f32).wait();
  std::vector<std::vector<Range>> ranges(world);
  std::size_t at = 0;
  for (std::size_t r = 0; r < world; ++r) {
    ranges[r].resize(counts[r] / 6);
    if (counts[r]) std::memcpy(ranges[r].data(), all.data() + at, counts[r] * sizeof(float));
    at += counts[r];
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
        source->get(static_cast<ParamId>(r.param), r.first + offset, k, StateArray::master, out);
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
// `file`; each rank appends its own to `scratch`.
void relay(const std::vector<std::vector<Range>>& ranges, WeightsFile* file, ScratchFile* scratch,
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
      cursors[r].take(counts[r], me == 0 ? file : nullptr, at);
      at += counts[r];
    }
    received.resize(counts[me]);
    comm.reduce_scatter_v_async(send.data(), received.data(), counts, DType::f32, ReduceOp::sum)
        .wait();
    if (me != 0) scratch->append(received.data(), received.size());
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Some rank cannot see the file: rank 0 reads it for them (above).
WeightsImport import_through_rank_0(const Model& model, Strategy& strategy, const fs::path& path,
                                    bool seen, Communicator& comm) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string why;
  std::optional<SafetensorsReader> reader;
  std::optional<WeightsFile> file;
  if (comm.rank() == 0) {
    try {
      if (!seen)
        throw DataError("init_from: no weights at '" + path.string() + "' on rank 0 (host " +
                        host_name() +
                        "), which reads them for the ranks that cannot; give a .safetensors file "
                        "or a directory holding model.safetensors");
      reader.emplace(path);
      file.emplace(*reader, model);
    } catch (const DataError& e) {
      why = e.what();
    }
  }
  stop_together<DataError>(why, "init_from: rank 0 cannot read the weights (its error is above)",
                           comm);
  RangeRecorder recorder;
  strategy.load_state(recorder);
  const CommCounters mark = comm.counters();  // the relay's bytes, not load_state's
  const auto ranges = all_ranges(comm.rank() == 0 ? std::vector<Range>{} : recorder.ranges, comm);
  std::optional<ScratchFile> scratch;
  std::string scratch_error;
  try {
    if (comm.rank() != 0) scratch.emplace();
  } catch (const DataError& e) {
    scratch_error = e.what();
  }
  stop_together<DataError>(
      scratch_error, "init_from: another rank cannot keep the weights (its error is above)", comm);
  relay(ranges, file ? &*file : nullptr, scratch ? &*scratch : nullptr, comm);
  // Every rank's bytes sent, summed over the ranks.
  float moved = static_cast<float>(comm.counters().since(mark).total_bytes());
  comm.all_reduce(&moved, 1, DType::f32, ReduceOp::sum);
  if (file) {
    strategy.load_state(*file);
  } else {
    ReceivedWeights received(*scratch, recorder.ranges);
    strategy.load_state(received);
  }
  WeightsImport w;
  w.from_rank_0 = true;
  w.bytes_read = file ? file->bytes_read() : 0;
  w.file_bytes = file ? file->file_bytes() : 0;
  w.bytes_moved = static_cast<std::uint64_t>(moved);
  w.seconds = seconds_since(t0);
  return w;
}

}  // namespace

WeightsFile::WeightsFile(const SafetensorsReader& file, const Model& model)
    : file_(file), params_(model.params()), match_(match_params(file, model)) {}

std::uint64_t WeightsFile::file_bytes() const {
  std::uint64_t bytes = 0;
  for (const SafetensorsEntry* e : match_) bytes += e->bytes;
  return bytes;
}

void WeightsFile::get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
                      float* out) {
  if (a != StateArray::master) return std::fill(out, out + count, 0.0f);  // a fresh optimizer
  const auto i = static_cast<std::size_t>(p);
  const SafetensorsEntry& e = *match_.at(i);
  if (params_[i].hf_transposed) return read_transposed(e, params_[i].shape, first, count, out);
  file_.read_f32(e, first, count, out);
  bytes_read_ += count * dtype_size(e.dtype);
}

// Model element (i, j) of shape (R, C) is the file's (j, i): for each file
// row j the model rows i with first <= i*C + j < first + count are one
// contiguous segment of it.
void WeightsFile::read_transposed(const SafetensorsEntry& e, const Shape& shape,
                                  std::uint64_t first, std::uint64_t count, float* out) {
  const auto R = static_cast<std::uint64_t>(shape[0]), C = static_cast<std::uint64_t>(shape[1]);
  const std::uint64_t end = first + count;
  for (std::uint64_t j = 0; j < C; ++j) {
    const std::uint64_t lo = first > j ? (first - j + C - 1) / C : 0;
    const std::uint64_t hi = std::min(R, end > j ? (end - j + C - 1) / C : 0);
    if (lo >= hi) continue;
    segment_.resize(static_cast<std::size_t>(hi - lo));
    file_.read_f32(e, j * R + lo, hi - lo, segment_.data());
    for (std::uint64_t i = lo; i < hi; ++i) out[i * C + j - first] = segment_[i - lo];
    bytes_read_ += (hi - lo) * dtype_size(e.dtype);
  }
}

WeightsImport import_weights(const Model& model, Strategy& strategy, const fs::path& in,
                             Communicator& comm) {
  const fs::path path = fs::is_directory(in) ? in / "model.safetensors" : in;
  const bool seen = fs::exists(path);
  if (comm.size() > 1 && any_rank(!seen, comm))
    return import_through_rank_0(model, strategy, path, seen, comm);
  // Every rank reads its own ranges.
  const auto t0 = std::chrono::steady_clock::now();
  if (!seen)
    throw DataError("init_from: no weights at '" + path.string() +
                    "'; give a .safetensors file or a directory holding model.safetensors");
  if (comm.size() > 1) check_files_agree("init_from", {path.string()}, comm);  // none stale
  const SafetensorsReader reader(path);
  WeightsFile file(reader, model);
  strategy.load_state(file);
  WeightsImport w;
  w.bytes_read = file.bytes_read();
  w.file_bytes = file.file_bytes();
  w.seconds = seconds_since(t0);
  return w;
}

}  // namespace ztrain
