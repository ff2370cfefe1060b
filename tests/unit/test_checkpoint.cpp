// Checkpoint pieces: the CRC-32C against its plain reference, flat ranges
// to parameter ranges and back, the manifest's checks, and a reader that
// reads only the blocks a range needs and names a corrupt one.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>

#include "checkpoint/manifest.h"
#include "checkpoint/rank_file.h"
#include "checkpoint/reader.h"
#include "io/crc32c.h"
#include "io/durable_file.h"
#include "ztrain/device.h"
#include "ztrain/error.h"
#include "ztrain/shard/state_ranges.h"

using namespace ztrain;
using namespace ztrain::id_literals;
namespace fs = std::filesystem;

namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// State kept per (param, array), element by element.
struct MapState final : StateSink, StateSource {
  std::map<std::tuple<ParamId, int, std::uint64_t>, float> values;
  int puts = 0;
  void put(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
           const float* v) override {
    ++puts;
    for (std::uint64_t i = 0; i < count; ++i) values[{p, static_cast<int>(a), first + i}] = v[i];
  }
  void get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a, float* out) override {
    for (std::uint64_t i = 0; i < count; ++i)
      out[i] = values.at({p, static_cast<int>(a), first + i});
  }
};

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("ztrain_ckpt_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

// A one-parameter checkpoint of n elements per array in rank_0.bin: master
// = i, m = 2i, v = 3i.
Manifest write_single(const fs::path& dir, std::uint64_t n) {
  Manifest m;
  m.ztrain_version = "test";
  m.strategy = "ddp";
  m.precision = "fp32";
  m.params.push_back({"w", {static_cast<std::int64_t>(n)}, {}});
  DurableFile f(dir / "rank_0.bin");
  std::vector<float> v(n);
  for (int a = 0; a < 3; ++a) {
    for (std::uint64_t i = 0; i < n; ++i) v[i] = static_cast<float>((a + 1) * i);
    StatePiece s{static_cast<StateArray>(a), 0, 0, n, f.size(), {}};
    for (std::uint64_t b = 0; b < n; b += kBlockElements)
      s.crcs.push_back(crc32c(v.data() + b, std::min(kBlockElements, n - b) * 4));
    f.write(v.data(), n * 4);
    m.params[0_param].pieces.push_back(s);
  }
  f.finish();
  m.files.push_back({"rank_0.bin", fs::file_size(dir / "rank_0.bin")});
  write_file_atomically(dir / "manifest.json", manifest_json(m));
  return m;
}

}  // namespace

TEST_CASE(
    "crc32c: the check value, and the fast path and the copying one equal the reference at every "
    "length") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(crc32c_reference("123456789", 9) == 0xE3069283u);
  std::mt19937 rng(7);
  std::vector<unsigned char> data(200003);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  // Past 24 KiB the fast path runs three chains over 8 KiB thirds: lengths
  // around those multiples, odd ones and a whole odd tail included.
  for (std::size_t n :
       {0, 1, 7, 8, 9, 63, 64, 65, 1000, 4099, 24575, 24576, 24577, 24583, 49152, 73735, 200003}) {
    CHECK(crc32c(data.data(), n) == crc32c_reference(data.data(), n));
    // Continued over two calls, as over two writes.
    CHECK(crc32c(data.data() + n / 2, n - n / 2, crc32c(data.data(), n / 2)) ==
          crc32c_reference(data.data(), n));
    // Copied and checked in one pass: the same checksum, every byte copied
    // and nothing past the end written.
    std::vector<unsigned char> copy(n + 16, 0xA5);
    CHECK(crc32c_copy(copy.data(), data.data(), n) == crc32c_reference(data.data(), n));
    CHECK(std::equal(data.begin(), data.begin() + static_cast<long>(n), copy.begin()));
    CHECK(std::all_of(copy.begin() + static_cast<long>(n), copy.end(),
                      [](unsigned char b) { return b == 0xA5; }));
  }
}

namespace {

// Parameters of 5, 21 and 2 elements: at world 2 the padding between them
// and the shard boundary fall mid-parameter.
ParamSpecs three_params() {
  ParamSpecs params(3);
  params[0_param].name = "a";
  params[0_param].shape = Shape{5};
  params[1_param].name = "b";
  params[1_param].shape = Shape{3, 7};
  params[2_param].name = "c";
  params[2_param].shape = Shape{2};
  return params;
}

}  // namespace

TEST_CASE("state ranges: flat ranges become parameter ranges, padding is never stored") {
  const ParamSpecs params = three_params();
  const shard::FlatLayout layout(params, 2);
  std::vector<float> flat(layout.total());
  for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<float>(i + 1);
  MapState state;
  // Saved in two rank ranges, as a 2-rank shard would.
  for (int r = 0; r < 2; ++r)
    shard::put_range(state, layout, layout.owned_begin(r), layout.owned_end(r), StateArray::m,
                     flat.data() + layout.owned_begin(r));
  CHECK(state.values.size() == 5 + 21 + 2);
  CHECK(state.values.at({1_param, 1, 4}) == flat[layout.offset(1_param) + 4]);
  // Read back through another split: the parameters' elements, zeros between.
  const shard::FlatLayout other(params, 3);
  std::vector<float> back(other.total(), -1);
  for (int r = 0; r < 3; ++r)
    shard::get_range(state, other, other.owned_begin(r), other.owned_end(r), StateArray::m,
                     back.data() + other.owned_begin(r));
  for (ParamId p : params.ids())
    for (std::uint64_t i = 0; i < other.numel(p); ++i)
      CHECK(back[other.offset(p) + i] == flat[layout.offset(p) + i]);
  CHECK(back[other.offset(0_param) + 5] == 0.0f);  // padding after a
}

TEST_CASE("clipped sink: copies of one shard each save their part, together all of it once") {
  const ParamSpecs params = three_params();
  const shard::FlatLayout layout(params, 2);
  std::vector<float> flat(layout.total());
  for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<float>(i + 1);
  // Rank 0's shard, held by 3 copies: copy i saves its i-th third.
  const std::uint64_t b = layout.owned_begin(0), n = layout.owned_end(0) - b;
  MapState state;
  std::uint64_t saved = 0;
  for (std::uint64_t i = 0; i < 3; ++i) {
    MapState part;
    shard::ClippedSink clipped(part, layout, b + n * i / 3, b + n * (i + 1) / 3);
    shard::put_range(clipped, layout, b, b + n, StateArray::v, flat.data() + b);
    for (const auto& [key, value] : part.values) {
      CHECK(state.values.count(key) == 0);  // no element saved twice
      state.values[key] = value;
    }
    saved += part.values.size();
  }
  std::uint64_t stored = 0;  // rank 0's elements, padding aside
  for (const auto& seg : layout.segments(b, b + n)) stored += seg.end - seg.begin;
  CHECK(saved == stored);
  for (const auto& [key, value] : state.values) {
    const auto [p, a, e] = key;
    CHECK(a == static_cast<int>(StateArray::v));
    CHECK(value == flat[layout.offset(p) + e]);
  }
}

TEST_CASE("manifest: round trip, and the tiling of every array is checked") {
  Manifest m;
  m.ztrain_version = "x";
  m.world = 2;
  m.strategy = "zero3";
  m.precision = "bf16";
  m.position = {12, 11, 1, {1024, 1, 12, 6}};
  m.config = {{"train.lr", "0.003"}};
  m.files = {{"rank_0.bin", 1000}, {"rank_1.bin", 1000}};
  ParamState p{"w", {10, 10}, {}};  // 25 elements in rank 0's file, 75 in rank 1's
  for (int a = 0; a < 3; ++a) {
    const std::uint64_t at = 200 * static_cast<std::uint64_t>(a) / 2;  // 100 bytes apart
    p.pieces.push_back({static_cast<StateArray>(a), 0, 0, 25, at, {1}});
    p.pieces.push_back({static_cast<StateArray>(a), 1, 25, 75, at, {2}});
  }
  m.params.push_back(p);
  const Manifest back = parse_manifest(manifest_json(m), "m.json");
  CHECK(back.position.applied == 11);
  CHECK(back.position.scaler.scale == 1024);
  CHECK(back.params[0_param].pieces.size() == 6);
  CHECK(back.config[0].second == "0.003");

  Manifest gap = m;
  gap.params[0_param].pieces[2].first = 1;  // m's first piece starts late
  gap.params[0_param].pieces[2].count = 24;
  CHECK(contains(message_of([&] { parse_manifest(manifest_json(gap), "m.json"); }),
                 "w's m has no piece for elements [0, 1)"));
  Manifest lap = m;
  lap.params[0_param].pieces[5].first = 20;
  lap.params[0_param].pieces[5].count = 80;
  lap.params[0_param].pieces[5].crcs = {1};
  CHECK(contains(message_of([&] { parse_manifest(manifest_json(lap), "m.json"); }),
                 "overlapping pieces at element 20"));
  Manifest outside = m;
  outside.params[0_param].pieces[1].offset = 800;  // 75 elements from byte 800 of 1000
  CHECK(contains(message_of([&] { parse_manifest(manifest_json(outside), "m.json"); }),
                 "lies outside its file"));
  CHECK(contains(message_of([] { parse_manifest("{\"format\": 3}", "m.json"); }),
                 "not a ztrain checkpoint manifest"));
}

TEST_CASE("reader: a range reads only its blocks, and a bad block is named") {
  TempDir tmp;
  const std::uint64_t n = 2 * kBlockElements + 1000;
  write_single(tmp.path, n);
  const Checkpoint c(Checkpoint::locate(tmp.path));
  {
    CheckpointSource source(c);
    // Elements straddling the first block boundary: two blocks read.
    std::vector<float> out(20);
    source.get(0_param, kBlockElements - 10, 20, StateArray::v, out.data());
    for (std::uint64_t i = 0; i < 20; ++i)
      CHECK(out[i] == static_cast<float>(3 * (kBlockElements - 10 + i)));
    CHECK(source.bytes_read() == 2 * kBlockElements * 4);
    // The short last block alone.
    source.get(0_param, n - 5, 5, StateArray::m, out.data());
    CHECK(out[4] == static_cast<float>(2 * (n - 1)));
    CHECK(source.bytes_read() == 2 * kBlockElements * 4 + 1000 * 4);
  }
  {
    // Whole blocks between partial ends: each block read once.
    CheckpointSource source(c);
    std::vector<float> out(kBlockElements + 510);
    source.get(0_param, kBlockElements - 10, kBlockElements + 510, StateArray::master, out.data());
    CHECK(source.bytes_read() == (2 * kBlockElements + 1000) * 4);
    for (std::uint64_t i = 0; i < out.size(); ++i)
      if (out[i] != static_cast<float>(kBlockElements - 10 + i)) FAIL("element " << i);
  }
  {
    // Random ranges of each array against the values written.
    CheckpointSource source(c);
    std::mt19937_64 rng(7);
    std::vector<float> out;
    for (int trial = 0; trial < 60; ++trial) {
      const std::uint64_t a = rng() % n, b = rng() % n;
      const std::uint64_t lo = std::min(a, b), count = std::max(a, b) - lo + 1;
      const int array = trial % 3;
      out.assign(count, -1.0f);
      source.get(0_param, lo, count, static_cast<StateArray>(array), out.data());
      for (std::uint64_t i = 0; i < count; ++i)
        if (out[i] != static_cast<float>((array + 1) * (lo + i)))
          FAIL("trial " << trial << ": element " << lo + i);
    }
  }
  CHECK(c.verify() == 3 * n * 4);
  // One flipped byte in m's second block.
  {
    std::fstream f(tmp.path / "rank_0.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>((n + kBlockElements + 3) * 4));
    f.put('\x7f');
  }
  const Checkpoint damaged(tmp.path);
  const std::string why = message_of([&] { damaged.verify(); });
  const std::uint64_t at = (n + kBlockElements) * 4;
  CHECK(contains(
      why, "bytes [" + std::to_string(at) + ", " + std::to_string(at + kBlockElements * 4) + ")"));
  CHECK(contains(why, "w's m, elements [" + std::to_string(kBlockElements) + ", "));
  CHECK(contains(why, "fail their checksum"));
  // Ranges that avoid the bad block still read.
  CheckpointSource source(damaged);
  std::vector<float> out(10);
  source.get(0_param, 0, 10, StateArray::m, out.data());
  CHECK(out[9] == 18.0f);
  CHECK(contains(
      message_of([&] { source.get(0_param, kBlockElements, 10, StateArray::m, out.data()); }),
      "fail their checksum"));
}

namespace {

// Drops a file's pages from the page cache (written back first), so that
// a reader opening it next reads it with pread(), not from its mapping.
void evict(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Reads a whole file, so that all of it is in the page cache: the reader's
// copy from the mapping.
void warm(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::vector<char> buffer(1 << 20);
  while (in.read(buffer.data(), static_cast<std::streamsize>(buffer.size())) || in.gcount() > 0) {
  }
}

}  // namespace

TEST_CASE("reader: a range of many blocks, read and checked by two threads, every block checked") {
  TempDir tmp;
  const std::uint64_t n = 5 * kBlockElements + 1000;
  write_single(tmp.path, n);
  const Checkpoint c(Checkpoint::locate(tmp.path));
  std::vector<float> out(n, -1.0f);
  for (const bool from_disk : {false, true}) {
    INFO((from_disk ? "from disk" : "from the page cache"));
    from_disk ? evict(tmp.path / "rank_0.bin") : warm(tmp.path / "rank_0.bin");
    CheckpointSource source(c);
    std::fill(out.begin(), out.end(), -1.0f);
    source.get(0_param, 0, n, StateArray::v, out.data());
    CHECK(source.bytes_read() == n * 4);
    for (std::uint64_t i = 0; i < n; ++i)
      if (out[i] != static_cast<float>(3 * i)) FAIL("element " << i);
  }
  // One flipped byte in v's fifth block: the whole-array read names it.
  {
    std::fstream f(tmp.path / "rank_0.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>((2 * n + 4 * kBlockElements + 9) * 4));
    f.put('\x7f');
  }
  const Checkpoint damaged(tmp.path);
  for (const bool from_disk : {false, true}) {
    INFO((from_disk ? "from disk" : "from the page cache"));
    from_disk ? evict(tmp.path / "rank_0.bin") : warm(tmp.path / "rank_0.bin");
    CheckpointSource source(damaged);
    const std::string why =
        message_of([&] { source.get(0_param, 0, n, StateArray::v, out.data()); });
    CHECK(contains(why, "w's v, elements [" + std::to_string(4 * kBlockElements) + ", " +
                            std::to_string(5 * kBlockElements) + ")"));
    // The blocks before it were read and checked; m's are untouched.
    source.get(0_param, 0, n, StateArray::m, out.data());
    CHECK(out[n - 1] == static_cast<float>(2 * (n - 1)));
  }
}

TEST_CASE("reader: latest, a missing or truncated rank file") {
  TempDir tmp;
  const fs::path step = tmp.path / "step_3";
  fs::create_directories(step);
  write_single(step, 100);
  CHECK(contains(message_of([&] { Checkpoint::locate(tmp.path); }), "neither a checkpoint"));
  write_file_atomically(tmp.path / "latest", "step_3\n");
  CHECK(Checkpoint::locate(tmp.path) == step);
  write_file_atomically(tmp.path / "latest", "step_9\n");
  CHECK(contains(message_of([&] { Checkpoint::locate(tmp.path); }), "names 'step_9'"));
  fs::resize_file(step / "rank_0.bin", 17);
  CHECK(contains(message_of([&] { Checkpoint c(step); }), "has 17 bytes, the manifest says 1200"));
  fs::remove(step / "rank_0.bin");
  CHECK(contains(message_of([&] { Checkpoint c(step); }), "rank_0.bin' is missing"));
}

TEST_CASE("rank state file: the snapshot is a copy, and the file is the same whatever it holds") {
  TempDir tmp;
  const auto device = make_cpu_device(1);
  SnapshotBuffers buffers(*device);
  const std::vector<std::uint64_t> sizes = {1000, kBlockElements + 10, 500};
  std::uint64_t total = 0;
  for (std::uint64_t n : sizes) total += n * 4;
  // allowance: none (written as put), the first piece only (then spilled),
  // all of it (written after put() returned, from the copy).
  std::vector<std::string> files;
  for (const std::uint64_t allowance : {std::uint64_t{0}, std::uint64_t{4000}, total}) {
    CAPTURE(allowance);
    const fs::path dir = tmp.path / std::to_string(allowance);
    fs::create_directories(dir);
    CrashPoints crash(CheckpointKill{}, -1, 0);
    RankStateFile file(dir, 0, buffers, allowance, crash);
    std::vector<std::vector<float>> live;
    for (std::size_t p = 0; p < sizes.size(); ++p) {
      live.emplace_back(sizes[p]);
      for (std::uint64_t i = 0; i < sizes[p]; ++i)
        live[p][i] = static_cast<float>(p) * 1e6f + static_cast<float>(i);
      file.put(static_cast<ParamId>(p), 0, sizes[p], StateArray::m, live[p].data());
    }
    CHECK(file.snapshot_whole() == (allowance == total));
    CHECK(file.bytes_held() == (allowance == total ? total : 0));
    // Training goes on: the live state changes before the file is written.
    for (auto& v : live) std::fill(v.begin(), v.end(), -1.0f);
    file.write();
    file.release();
    // The copies are kept for the next snapshot, in the accounting.
    const MemoryStats s = device->stats();
    CHECK(s.current[Tier::host][Category::checkpoint] == buffers.kept_bytes());
    std::ifstream in(dir / "rank_0.bin", std::ios::binary);
    files.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    REQUIRE(files.back().size() == total);
    const float* values = reinterpret_cast<const float*>(files.back().data());
    CHECK(values[999] == 999.0f);
    CHECK(values[1000 + kBlockElements + 9] == 1e6f + static_cast<float>(kBlockElements + 9));
    CHECK(values[total / 4 - 1] == 2e6f + 499.0f);
    const auto pieces = parse_pieces(read_whole_file(dir / "rank_0.pieces.json"), dir);
    REQUIRE(pieces.size() == 3);
    CHECK(pieces[1].second.offset == 4000);
    CHECK(pieces[1].second.crcs.size() == 2);
    CHECK(pieces[1].second.crcs[1] == crc32c(values + 1000 + kBlockElements, 40));
  }
  // The whole copy was made once and its buffers reused: one copy's bytes
  // at most.
  CHECK(buffers.kept_bytes() == total);
  CHECK(device->stats().peak[Tier::host][Category::checkpoint] == total);
  CHECK(files[0] == files[1]);
  CHECK(files[0] == files[2]);
}
