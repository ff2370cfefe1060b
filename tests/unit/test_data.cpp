// Data plugins (synthetic, tokens, text), TokenWindows and DataLoader.
//
// The plugins are loaded from the build tree through the real plugin loader
// and fed real files written to a scratch directory.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support.h"
#include "train/data_loader.h"
#include "ztrain/data.h"
#include "ztrain/error.h"
#include "ztrain/mapped_file.h"

namespace {

using namespace ztrain;
using ztrain::test::create_data_source;
using ztrain::test::message_of;
using ztrain::test::TempDir;

using Seq = std::vector<std::int32_t>;

std::shared_ptr<DataSource> make_source(const std::string& plugin, const std::string& body,
                                        const DataSetup& setup) {
  auto src = create_data_source(plugin, body);
  src->setup(setup);
  return src;
}

struct Pair {
  Seq inputs, targets;
  bool operator==(const Pair&) const = default;
};

Pair fetch(const DataSource& src, Split split, std::uint64_t index, int T) {
  Pair p{Seq(static_cast<std::size_t>(T), -1), Seq(static_cast<std::size_t>(T), -1)};
  src.fill(split, index, p.inputs.data(), p.targets.data());
  return p;
}

// TOML literal string for a path (no escapes needed).
std::string lit(const std::filesystem::path& p) {
  return "'" + p.string() + "'";
}

void write_bytes(const std::filesystem::path& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

template <class T>
void append(std::vector<std::uint8_t>& out, T v) {
  const std::size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

// An llm.c header: 256 int32, magic, version, count, rest zero.
std::vector<std::uint8_t> llmc_header(std::int32_t magic, std::int32_t version,
                                      std::int32_t count) {
  std::vector<std::uint8_t> out(256 * sizeof(std::int32_t), 0);
  const std::int32_t head[3] = {magic, version, count};
  std::memcpy(out.data(), head, sizeof head);
  return out;
}

// llm.c v1 file: uint16 tokens. `count` defaults to the true count.
void write_llmc_v1(const std::filesystem::path& path, const std::vector<std::uint32_t>& tokens,
                   std::int32_t magic = 20240520, std::int32_t version = 1,
                   std::int32_t count = -1) {
  auto bytes =
      llmc_header(magic, version, count < 0 ? static_cast<std::int32_t>(tokens.size()) : count);
  for (auto t : tokens) append(bytes, static_cast<std::uint16_t>(t));
  write_bytes(path, bytes);
}

// llm.c v7 file: uint32 tokens.
void write_llmc_v7(const std::filesystem::path& path, const std::vector<std::uint32_t>& tokens) {
  auto bytes = llmc_header(20240801, 7, static_cast<std::int32_t>(tokens.size()));
  for (auto t : tokens) append(bytes, t);
  write_bytes(path, bytes);
}

// nanoGPT: bare uint16.
void write_nanogpt(const std::filesystem::path& path, const std::vector<std::uint32_t>& tokens) {
  std::vector<std::uint8_t> bytes;
  for (auto t : tokens) append(bytes, static_cast<std::uint16_t>(t));
  write_bytes(path, bytes);
}

std::vector<std::uint32_t> token_stream(std::size_t n, std::uint32_t mod, std::uint32_t mul = 37) {
  std::vector<std::uint32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint32_t>((i * mul + 11) % mod);
  return v;
}

// Window `start` of a token stream as the plugin must return it.
Pair window(const std::vector<std::uint32_t>& tokens, std::size_t start, int T) {
  Pair p;
  for (int t = 0; t < T; ++t) {
    p.inputs.push_back(static_cast<std::int32_t>(tokens[start + static_cast<std::size_t>(t)]));
    p.targets.push_back(static_cast<std::int32_t>(tokens[start + static_cast<std::size_t>(t) + 1]));
  }
  return p;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

double expected_entropy(int K, double skew) {
  std::vector<double> w;
  double total = 0;
  for (int k = 0; k < K; ++k) {
    w.push_back(1.0 / std::pow(k + 1.0, skew));
    total += w.back();
  }
  double h = 0;
  for (double wk : w) h -= (wk / total) * std::log(wk / total);
  return h;
}

}  // namespace

// ---------------------------------------------------------------- synthetic

TEST_CASE("synthetic: the same seed gives the same sequences, another seed others") {
  const int T = 32;
  auto a = make_source("synthetic", "", {T, 512, 7});
  auto b = make_source("synthetic", "", {T, 512, 7});
  auto c = make_source("synthetic", "", {T, 512, 8});
  int differ = 0;
  for (std::uint64_t i = 0; i < 20; ++i) {
    const Pair pa = fetch(*a, Split::train, i, T);
    CHECK(pa == fetch(*b, Split::train, i, T));
    CHECK(pa == fetch(*a, Split::train, i, T));  // a pure function of the index
    CHECK(fetch(*a, Split::val, i, T) == fetch(*b, Split::val, i, T));
    if (!(pa == fetch(*c, Split::train, i, T))) ++differ;
  }
  CHECK(differ == 20);
  // Neighbouring indices are different sequences too.
  CHECK_FALSE(fetch(*a, Split::train, 0, T) == fetch(*a, Split::train, 1, T));
}

TEST_CASE("synthetic: train and val splits differ") {
  const int T = 32;
  auto s = make_source("synthetic", "", {T, 512, 1234});
  int differ = 0;
  for (std::uint64_t i = 0; i < 20; ++i)
    if (!(fetch(*s, Split::train, i, T) == fetch(*s, Split::val, i, T))) ++differ;
  CHECK(differ == 20);
}

TEST_CASE("synthetic: targets are the inputs shifted by one and ids are below the vocabulary") {
  const int T = 48, V = 100;
  auto s = make_source("synthetic", "branching = 6\n", {T, V, 5});
  std::set<std::int32_t> seen;
  for (auto split : {Split::train, Split::val}) {
    for (std::uint64_t i = 0; i < 50; ++i) {
      const Pair p = fetch(*s, split, i, T);
      for (int t = 0; t + 1 < T; ++t) REQUIRE(p.targets[t] == p.inputs[t + 1]);
      for (int t = 0; t < T; ++t) {
        REQUIRE(p.inputs[t] >= 0);
        REQUIRE(p.inputs[t] < V);
        REQUIRE(p.targets[t] >= 0);
        REQUIRE(p.targets[t] < V);
        seen.insert(p.inputs[t]);
      }
    }
  }
  // 4800 draws from a chain that is uniform at every position cover the vocabulary.
  CHECK(seen.size() == static_cast<std::size_t>(V));
  CHECK(s->info().vocab_used == V);
}

TEST_CASE("synthetic: info().entropy_rate is H(p) of the declared branching and skew") {
  struct Case {
    int K;
    double skew;
  };
  for (const Case c : {Case{4, 1.0}, Case{5, 1.5}, Case{1, 1.0}, Case{8, 0.0}, Case{16, 2.0}}) {
    CAPTURE(c.K);
    CAPTURE(c.skew);
    auto s = make_source(
        "synthetic",
        "branching = " + std::to_string(c.K) + "\nskew = " + std::to_string(c.skew) + "\n",
        {16, 512, 1});
    const DataInfo info = s->info();
    REQUIRE(info.entropy_rate.has_value());
    CHECK(*info.entropy_rate == doctest::Approx(expected_entropy(c.K, c.skew)).epsilon(1e-12));
  }
  // Spot values: skew 0 is uniform over K successors, K = 1 is deterministic.
  CHECK(*make_source("synthetic", "branching = 8\nskew = 0\n", {16, 512, 1})->info().entropy_rate ==
        doctest::Approx(std::log(8.0)).epsilon(1e-12));
  CHECK(*make_source("synthetic", "branching = 1\n", {16, 512, 1})->info().entropy_rate == 0.0);
  // The defaults (K = 4, skew = 1): p = (12, 6, 4, 3) / 25.
  const double h = -(12 * std::log(12.0 / 25) + 6 * std::log(6.0 / 25) + 4 * std::log(4.0 / 25) +
                     3 * std::log(3.0 / 25)) /
                   25;
  CHECK(*make_source("synthetic", "", {16, 512, 1})->info().entropy_rate ==
        doctest::Approx(h).epsilon(1e-12));
}

TEST_CASE("synthetic: the empirical conditional entropy matches entropy_rate") {
  // Count (previous, next) transitions over many sequences and estimate
  // H(next | previous) = -sum_xy p(x,y) log p(y|x). With 64 contexts and
  // about 4000 samples each, the plug-in estimator's bias (~(K-1)/(2n) per
  // context) and noise are both far below the tolerance.
  const double tolerance = 0.01;
  struct Case {
    int V, K;
    double skew;
  };
  for (const Case c : {Case{64, 4, 1.0}, Case{64, 7, 0.5}, Case{60, 3, 2.0}}) {
    CAPTURE(c.V);
    CAPTURE(c.K);
    CAPTURE(c.skew);
    const int T = 64;
    auto s =
        make_source("synthetic",
                    "vocab_size = " + std::to_string(c.V) + "\nbranching = " + std::to_string(c.K) +
                        "\nskew = " + std::to_string(c.skew) + "\n",
                    {T, 512, 99});
    std::vector<std::int64_t> counts(static_cast<std::size_t>(c.V * c.V), 0);
    std::vector<std::int64_t> first(static_cast<std::size_t>(c.V), 0);
    std::int64_t n = 0;
    for (std::uint64_t i = 0; i < 4000; ++i) {
      const Pair p = fetch(*s, Split::train, i, T);
      ++first[static_cast<std::size_t>(p.inputs[0])];
      for (int t = 0; t < T; ++t) {
        ++counts[static_cast<std::size_t>(p.inputs[t] * c.V + p.targets[t])];
        ++n;
      }
    }
    double h = 0;
    for (int x = 0; x < c.V; ++x) {
      std::int64_t row = 0, successors = 0;
      for (int y = 0; y < c.V; ++y) {
        row += counts[static_cast<std::size_t>(x * c.V + y)];
        successors += counts[static_cast<std::size_t>(x * c.V + y)] > 0;
      }
      REQUIRE(row > 0);
      CHECK(successors <= c.K);  // exactly K successors per token, never more
      for (int y = 0; y < c.V; ++y) {
        const auto cxy = counts[static_cast<std::size_t>(x * c.V + y)];
        if (cxy == 0) continue;
        h -= (static_cast<double>(cxy) / static_cast<double>(n)) *
             std::log(static_cast<double>(cxy) / static_cast<double>(row));
      }
    }
    const double rate = *s->info().entropy_rate;
    CAPTURE(h);
    CAPTURE(rate);
    CHECK(rate == doctest::Approx(expected_entropy(c.K, c.skew)).epsilon(1e-12));
    CHECK(std::abs(h - rate) < tolerance);
    // The first token is uniform: no token is more than 2x over- or under-represented.
    for (auto f : first) {
      CHECK(f > 4000 / c.V / 2);
      CHECK(f < 4000 / c.V * 2);
    }
  }
}

TEST_CASE(
    "synthetic: vocab_size option limits the ids and branching beyond the vocabulary is an error") {
  const int T = 32;
  auto s = make_source("synthetic", "vocab_size = 50\n", {T, 512, 3});
  CHECK(s->info().vocab_used == 50);
  std::int32_t max_id = 0;
  for (std::uint64_t i = 0; i < 100; ++i) {
    const Pair p = fetch(*s, Split::train, i, T);
    for (int t = 0; t < T; ++t) {
      REQUIRE(p.inputs[t] < 50);
      REQUIRE(p.targets[t] < 50);
      max_id = std::max(max_id, p.inputs[t]);
    }
  }
  CHECK(max_id == 49);

  // vocab_size = 0 means the model's vocabulary.
  CHECK(make_source("synthetic", "vocab_size = 0\n", {T, 300, 3})->info().vocab_used == 300);

  {
    auto bad = create_data_source("synthetic", "vocab_size = 3\nbranching = 4\n");
    const std::string msg = message_of<ConfigError>([&] { bad->setup({T, 512, 3}); });
    CHECK(contains(msg, "branching"));
    CHECK(contains(msg, "(4)"));
    CHECK(contains(msg, "(3)"));
    CHECK(contains(msg, "t.toml:"));  // points at the option
  }
  {
    // Against the model's vocabulary when vocab_size is not given.
    auto bad = create_data_source("synthetic", "branching = 10\n");
    const std::string msg = message_of<ConfigError>([&] { bad->setup({T, 8, 3}); });
    CHECK(contains(msg, "branching"));
    CHECK(contains(msg, "(8)"));
  }
  // Out-of-range option values are rejected by validation.
  CHECK(
      contains(message_of<ConfigError>([] { create_data_source("synthetic", "branching = 0\n"); }),
               "branching"));
  CHECK(contains(
      message_of<ConfigError>([] { create_data_source("synthetic", "vocab_size = -1\n"); }),
      "vocab_size"));
}

// ---------------------------------------------------------------- tokens

TEST_CASE("tokens: llm.c v1 (uint16) windows are exact and the tail is the val split") {
  TempDir dir;
  const auto path = dir / "train.bin";
  const auto tokens = token_stream(1000, 500);
  write_llmc_v1(path, tokens);
  const int T = 16;
  auto s = make_source("tokens", "path = " + lit(path) + "\nshuffle = false\n", {T, 512, 1});
  // val_fraction 0.1: the last 100 tokens are held out, 900 train tokens give
  // floor(899 / 16) = 56 windows.
  const std::size_t train_count = 900, windows = (train_count - 1) / T;
  for (std::size_t i = 0; i < windows; ++i) {
    CAPTURE(i);
    REQUIRE(fetch(*s, Split::train, i, T) == window(tokens, i * T, T));
  }
  // Past the last window the next epoch starts again at the first.
  CHECK(fetch(*s, Split::train, windows, T) == window(tokens, 0, T));
  CHECK(fetch(*s, Split::train, windows + 3, T) == window(tokens, 3 * T, T));
  // Training windows never reach into the held-out tail.
  CHECK((windows - 1) * T + T < train_count);
  // The val split starts at the first held-out token.
  const std::size_t val_windows = (100 - 1) / T;
  for (std::size_t j = 0; j < val_windows; ++j) {
    CAPTURE(j);
    REQUIRE(fetch(*s, Split::val, j, T) == window(tokens, train_count + j * T, T));
  }
  const DataInfo info = s->info();
  CHECK(info.vocab_used == 500);
  CHECK(contains(info.description, "train.bin"));
  CHECK(!info.entropy_rate.has_value());
}

TEST_CASE("tokens: llm.c v7 (uint32) reads 32-bit ids") {
  TempDir dir;
  const auto path = dir / "train32.bin";
  // Ids above 65535 prove the tokens are read as uint32.
  auto tokens = token_stream(800, 100000, 7919);
  tokens[0] = 99999;
  write_llmc_v7(path, tokens);
  const int T = 20;
  auto s = make_source("tokens", "path = " + lit(path) + "\nshuffle = false\nformat = \"llmc\"\n",
                       {T, 100000, 1});
  const std::size_t train_count = 720;
  for (std::size_t i = 0; i < (train_count - 1) / T; ++i) {
    CAPTURE(i);
    REQUIRE(fetch(*s, Split::train, i, T) == window(tokens, i * T, T));
  }
  CHECK(fetch(*s, Split::train, 0, T).inputs[0] == 99999);
  CHECK(fetch(*s, Split::val, 0, T) == window(tokens, train_count, T));
  CHECK(s->info().vocab_used == 100000);
  // The same file under format "auto" is recognised by its magic.
  auto a = make_source("tokens", "path = " + lit(path) + "\nshuffle = false\n", {T, 100000, 1});
  CHECK(fetch(*a, Split::train, 5, T) == window(tokens, 5 * T, T));
}

TEST_CASE("tokens: headerless nanoGPT uint16 files") {
  TempDir dir;
  const auto path = dir / "nano.bin";
  auto tokens = token_stream(640, 50257, 12345);
  tokens[3] = 50256;  // GPT-2's <|endoftext|>
  write_nanogpt(path, tokens);
  const int T = 8;
  for (const std::string format : {"auto", "nanogpt"}) {
    CAPTURE(format);
    auto s = make_source("tokens",
                         "path = " + lit(path) + "\nshuffle = false\nformat = \"" + format + "\"\n",
                         {T, 50257, 1});
    const std::size_t train_count = 576;  // 640 - 64 held out
    for (std::size_t i = 0; i < (train_count - 1) / T; ++i) {
      CAPTURE(i);
      REQUIRE(fetch(*s, Split::train, i, T) == window(tokens, i * T, T));
    }
    CHECK(fetch(*s, Split::val, 2, T) == window(tokens, train_count + 2 * T, T));
    CHECK(s->info().vocab_used == 50257);
  }
}

TEST_CASE("tokens: val_path gives the val split and val_fraction sets the held-out tail") {
  TempDir dir;
  const auto train = dir / "train.bin", val = dir / "val.bin";
  const auto train_tokens = token_stream(500, 300, 3);
  const auto val_tokens = token_stream(200, 300, 101);
  write_llmc_v1(train, train_tokens);
  write_llmc_v1(val, val_tokens);
  const int T = 10;
  {
    auto s = make_source(
        "tokens", "path = " + lit(train) + "\nval_path = " + lit(val) + "\nshuffle = false\n",
        {T, 512, 1});
    // The whole train file is training data: 49 windows.
    for (std::size_t i = 0; i < 49; ++i)
      REQUIRE(fetch(*s, Split::train, i, T) == window(train_tokens, i * T, T));
    for (std::size_t j = 0; j < 19; ++j) {
      CAPTURE(j);
      REQUIRE(fetch(*s, Split::val, j, T) == window(val_tokens, j * T, T));
    }
    // Val windows do not shuffle and wrap after the last one.
    CHECK(fetch(*s, Split::val, 19, T) == window(val_tokens, 0, T));
  }
  {
    auto s = make_source(
        "tokens", "path = " + lit(train) + "\nval_fraction = 0.3\nshuffle = false\n", {T, 512, 1});
    // 150 tokens held out; train is the first 350.
    CHECK(fetch(*s, Split::val, 0, T) == window(train_tokens, 350, T));
    CHECK(fetch(*s, Split::val, 13, T) == window(train_tokens, 350 + 130, T));
    CHECK(fetch(*s, Split::train, 33, T) == window(train_tokens, 330, T));
    CHECK(fetch(*s, Split::train, 34, T) == window(train_tokens, 0, T));  // 34 windows, then wrap
  }
}

TEST_CASE("tokens: shards by glob or list, windows within each, the val tail from the last") {
  TempDir dir;
  // Three shards of 95, 41 and 120 tokens (llm.c's names), one uint32.
  const std::vector<std::vector<std::uint32_t>> shards{
      token_stream(95, 300, 37), token_stream(41, 300, 41), token_stream(120, 300, 43)};
  std::vector<std::filesystem::path> paths;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    paths.push_back(dir / ("fineweb_train_00000" + std::to_string(i + 1) + ".bin"));
    if (i == 1)
      write_llmc_v7(paths.back(), shards[i]);
    else
      write_llmc_v1(paths.back(), shards[i]);
  }
  const int T = 10;
  const std::string glob = lit(dir / "fineweb_train_*.bin");
  const std::string list = "[" + lit(paths[0]) + ", " + lit(paths[1]) + ", " + lit(paths[2]) + "]";
  for (const std::string& path : {glob, list}) {
    CAPTURE(path);
    // 10% of 256 tokens held out (25), all from the last shard: it trains
    // on 95 of its 120. Windows: 9 + 4 + 9 = 22.
    auto s = make_source("tokens", "path = " + path + "\nshuffle = false\n", {T, 300, 1});
    CHECK(s->info().train_sequences == 22);
    CHECK(s->info().files.size() == 3);
    CHECK(contains(s->info().description, "tokens 3 files (256 tokens, uint32)"));
    for (std::size_t i = 0; i < 9; ++i)
      REQUIRE(fetch(*s, Split::train, i, T) == window(shards[0], i * T, T));
    for (std::size_t i = 0; i < 4; ++i)
      REQUIRE(fetch(*s, Split::train, 9 + i, T) == window(shards[1], i * T, T));
    for (std::size_t i = 0; i < 9; ++i)
      REQUIRE(fetch(*s, Split::train, 13 + i, T) == window(shards[2], i * T, T));
    CHECK(fetch(*s, Split::train, 22, T) == window(shards[0], 0, T));  // the next epoch
    CHECK(fetch(*s, Split::val, 0, T) == window(shards[2], 95, T));
  }
  // Shuffled: one epoch visits every window of every shard once.
  auto s = make_source("tokens", "path = " + glob + "\n", {T, 300, 1});
  std::set<Seq> seen;
  for (std::uint64_t i = 0; i < 22; ++i) seen.insert(fetch(*s, Split::train, i, T).inputs);
  CHECK(seen.size() == 22);
  // A held-out share larger than the last shard takes from the one before.
  auto wide = make_source("tokens", "path = " + list + "\nval_fraction = 0.5\nshuffle = false\n",
                          {T, 300, 1});
  CHECK(fetch(*wide, Split::val, 0, T) == window(shards[2], 0, T));  // 128: 120 and 8 of shard 1
  CHECK(wide->info().train_sequences == 9 + 3);
}

TEST_CASE("tokens: a pattern that matches nothing, a file named twice, val among the train files") {
  TempDir dir;
  write_llmc_v1(dir / "a_train.bin", token_stream(100, 300, 1));
  write_llmc_v1(dir / "a_val.bin", token_stream(100, 300, 2));
  const auto setup = [&](const std::string& body) {
    auto s = create_data_source("tokens", body);
    s->setup({8, 300, 1});
  };
  CHECK(contains(message_of<DataError>([&] { setup("path = " + lit(dir / "b_*.bin") + "\n"); }),
                 "b_*.bin' matches no file"));
  CHECK(contains(message_of<DataError>([&] {
                   setup("path = [" + lit(dir / "a_*.bin") + ", " + lit(dir / "a_val.bin") + "]\n");
                 }),
                 "a_val.bin' is named twice"));
  CHECK(contains(message_of<ConfigError>([&] {
                   setup("path = " + lit(dir / "a_*.bin") +
                         "\nval_path = " + lit(dir / "a_val.bin") + "\n");
                 }),
                 "a_val.bin' is also a training file"));
  // The same file named another way is still a training file: relative
  // with a ./, through a parent directory, through a symlink, a hard link.
  std::filesystem::create_symlink(dir / "a_train.bin", dir / "link.bin");
  std::filesystem::create_hard_link(dir / "a_train.bin", dir / "hard.bin");
  std::filesystem::create_directories(dir / "sub");
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  for (const std::string& other :
       {std::string("./a_train.bin"), lit(dir / "sub" / ".." / "a_train.bin"),
        lit(dir / "link.bin"), lit(dir / "hard.bin")}) {
    const std::string val = other.front() == '\'' ? other : "'" + other + "'";
    INFO("val_path = " << val);
    CHECK(contains(message_of<ConfigError>([&] {
                     setup("path = " + lit(dir / "a_train.bin") + "\nval_path = " + val + "\n");
                   }),
                   "is also a training file"));
  }
  std::filesystem::current_path(cwd);
  CHECK(contains(message_of<DataError>([&] { setup("path = " + lit(dir.path()) + "\n"); }),
                 "is a directory"));
  CHECK(contains(message_of<ConfigError>([&] { setup("path = []\n"); }),
                 "a file name or glob pattern, or a list of them"));
  CHECK(contains(message_of<ConfigError>([&] { setup("path = [1]\n"); }),
                 "a file name or glob pattern, or a list of them"));
}

TEST_CASE("tokens: corrupt files are DataErrors naming the file and the problem") {
  TempDir dir;
  const int T = 8;
  const auto tokens = token_stream(400, 256);
  auto setup_error = [&](const std::filesystem::path& path, const std::string& extra = "",
                         int vocab = 512) {
    auto s = create_data_source("tokens", "path = " + lit(path) + "\n" + extra);
    return message_of<DataError>([&] { s->setup({T, vocab, 1}); });
  };

  SUBCASE("wrong magic with format llmc") {
    const auto path = dir / "badmagic.bin";
    write_llmc_v1(path, tokens, 12345678);
    const std::string msg = setup_error(path, "format = \"llmc\"\n");
    CHECK(contains(msg, path.string()));
    CHECK(contains(msg, "magic"));
    CHECK(contains(msg, "12345678"));
  }
  SUBCASE("wrong magic with format auto: corrupt, never read as headerless tokens") {
    const auto path = dir / "badmagic_auto.bin";
    write_llmc_v1(path, tokens, 12345678);
    const std::string msg = setup_error(path, "", 50257);
    CHECK(contains(msg, path.string()));
    CHECK(contains(msg, "have an llm.c header's shape (version 1, 400 tokens)"));
    CHECK(contains(msg, "magic is 12345678"));
    CHECK(contains(msg, "the file is corrupt"));
  }
  SUBCASE("llm.c header shorter than 1024 bytes with format llmc") {
    const auto path = dir / "tiny.bin";
    write_nanogpt(path, token_stream(100, 256));
    const std::string msg = setup_error(path, "format = \"llmc\"\n");
    CHECK(contains(msg, path.string()));
    CHECK(contains(msg, "header"));
  }
  SUBCASE("wrong version for the magic") {
    const auto path = dir / "badversion.bin";
    write_llmc_v1(path, tokens, 20240520, 7);
    const std::string msg = setup_error(path);
    CHECK(contains(msg, path.string()));
    CHECK(contains(msg, "version"));
    CHECK(contains(msg, "20240520"));
    CHECK(contains(msg, "7"));
  }
  SUBCASE("header count does not match the file size") {
    const auto path = dir / "truncated.bin";
    write_llmc_v1(path, tokens, 20240520, 1, 1000);
    const std::string msg = setup_error(path);
    CHECK(contains(msg, path.string()));
    CHECK(contains(msg, "1000"));
    CHECK(contains(msg, "truncated"));
  }
  SUBCASE("odd-sized nanoGPT file") {
    const auto path = dir / "odd.bin";
    std::vector<std::uint8_t> bytes(2001, 1);
    write_bytes(path, bytes);
    const std::string msg = setup_error(path);
    CHECK(contains(msg, path.string()));
    CHECK(contains(msg, "odd"));
    CHECK(contains(msg, "2001"));
  }
  SUBCASE("token id outside the vocabulary") {
    const auto path = dir / "bigid.bin";
    auto bad = tokens;
    bad[123] = 600;
    write_llmc_v1(path, bad);
    const std::string msg = setup_error(path);
    CHECK(contains(msg, path.string()));
    CHECK(contains(msg, "600"));
    CHECK(contains(msg, "vocab_size 512"));
    CHECK(contains(msg, "token 123"));
  }
  SUBCASE("token id outside the vocabulary in val_path") {
    const auto train = dir / "ok.bin", val = dir / "badval.bin";
    write_llmc_v1(train, tokens);
    auto bad = tokens;
    bad[7] = 512;
    write_llmc_v1(val, bad);
    const std::string msg = setup_error(train, "val_path = " + lit(val) + "\n");
    CHECK(contains(msg, val.string()));
    CHECK(contains(msg, "512"));
  }
  SUBCASE("too short for one sequence") {
    const auto path = dir / "short.bin";
    write_llmc_v1(path,
                  token_stream(9, 256));  // 9 tokens, one sequence needs T + 1 = 9 train tokens
    const std::string msg = setup_error(path);
    CHECK(contains(msg, path.string()));
    CHECK(contains(msg, "fewer than one sequence"));
  }
  SUBCASE("held-out tail too short for one sequence") {
    const auto path = dir / "shorttail.bin";
    write_llmc_v1(path, token_stream(60, 256));  // 6 held-out tokens
    const std::string msg = setup_error(path);
    CHECK(contains(msg, path.string()));
    CHECK(contains(msg, "held-out"));
  }
  SUBCASE("missing file") {
    const auto path = dir / "does_not_exist.bin";
    const std::string msg = setup_error(path);
    CHECK(contains(msg, path.string()));
    CHECK(contains(msg, "No such file"));
  }
  SUBCASE("missing val_path file") {
    const auto train = dir / "ok.bin";
    write_llmc_v1(train, tokens);
    const auto val = dir / "no_val.bin";
    const std::string msg = setup_error(train, "val_path = " + lit(val) + "\n");
    CHECK(contains(msg, val.string()));
  }
}

TEST_CASE("tokens: missing path key is a ConfigError from validation") {
  const std::string msg =
      message_of<ConfigError>([] { create_data_source("tokens", "shuffle = false\n"); });
  CHECK(contains(msg, "path"));
  CHECK(contains(msg, "required"));
  CHECK(contains(msg, "t.toml"));
  // And a bad format choice names the key and the choices.
  const std::string fmt = message_of<ConfigError>(
      [] { create_data_source("tokens", "path = 'x.bin'\nformat = \"llm\"\n"); });
  CHECK(contains(fmt, "format"));
  CHECK(contains(fmt, "llmc"));
}

// ---------------------------------------------------------------- text

namespace {
std::string utf8_corpus(std::size_t min_bytes) {
  // Two-, three- and four-byte characters among ASCII; each line numbered,
  // so no stretch of the file repeats another (a periodic corpus let a val
  // split read from the wrong offset pass).
  const std::string line = " héllo wörld, naïve café — 日本語のテキスト 🚀✨ ok\n";
  std::string s;
  for (int i = 0; s.size() < min_bytes; ++i) s += std::to_string(i) + line;
  return s;
}
}  // namespace

TEST_CASE("text: a UTF-8 file loads as bytes and its tail is the val split") {
  TempDir dir;
  const auto path = dir / "corpus.txt";
  const std::string text = utf8_corpus(2000);
  write_bytes(path, std::vector<std::uint8_t>(text.begin(), text.end()));
  const std::size_t n = text.size();
  const std::size_t val_count = static_cast<std::size_t>(static_cast<double>(n) * 0.1);
  const std::size_t train_count = n - val_count;
  std::vector<std::uint32_t> bytes(text.begin(), text.end());
  for (auto& b : bytes) b &= 0xffu;  // char may be signed
  const int T = 16;
  auto s = make_source("text", "path = " + lit(path) + "\nshuffle = false\n", {T, 256, 1});
  bool high = false;
  for (std::size_t i = 0; i < (train_count - 1) / T; ++i) {
    CAPTURE(i);
    const Pair p = fetch(*s, Split::train, i, T);
    REQUIRE(p == window(bytes, i * T, T));
    for (auto id : p.inputs) {
      REQUIRE(id >= 0);
      REQUIRE(id < 256);
      high |= id >= 0x80;
    }
  }
  CHECK(high);  // multi-byte characters come through as their bytes
  for (std::size_t j = 0; j < (val_count - 1) / T; ++j) {
    CAPTURE(j);
    REQUIRE(fetch(*s, Split::val, j, T) == window(bytes, train_count + j * T, T));
  }
  CHECK(s->info().vocab_used == 256);
  CHECK(contains(s->info().description, "corpus.txt"));
  // A bigger model vocabulary is fine.
  CHECK_NOTHROW(make_source("text", "path = " + lit(path) + "\n", {T, 512, 1}));
}

TEST_CASE("text: invalid UTF-8 is a DataError naming the byte offset") {
  TempDir dir;
  const auto path = dir / "bad.txt";
  const int T = 8;
  const std::string good = utf8_corpus(600);
  auto expect_offset = [&](const std::string& bytes, std::size_t offset) {
    write_bytes(path, std::vector<std::uint8_t>(bytes.begin(), bytes.end()));
    auto s = create_data_source("text", "path = " + lit(path) + "\n");
    const std::string msg = message_of<DataError>([&] { s->setup({T, 256, 1}); });
    CAPTURE(msg);
    CHECK(contains(msg, path.string()));
    CHECK(contains(msg, "UTF-8"));
    CHECK(contains(msg, "byte offset " + std::to_string(offset)));
  };
  SUBCASE("a 0xff byte") {
    // After a prefix that is valid and contains multi-byte characters.
    const std::string b = good.substr(0, good.find('\n') + 1) + "\xff" + good;
    expect_offset(b, good.find('\n') + 1);
  }
  SUBCASE("a truncated three-byte sequence") {
    // "日" is e6 97 a5; drop the last byte and continue with ASCII.
    const std::size_t at = good.find('\n') + 1;
    const std::string b = good.substr(0, at) + "\xe6\x97" + "abc" + good;
    expect_offset(b, at);
  }
  SUBCASE("a truncated sequence at the end of the file") {
    const std::string b = good + "\xe6\x97";
    expect_offset(b, good.size());
  }
  SUBCASE("a lone continuation byte") {
    const std::string b = "abc\x80" + good;
    expect_offset(b, 3);
  }
  SUBCASE("an overlong encoding") {
    const std::string b = good.substr(0, 5) + "\xc0\xaf" + good;  // "héll" is 5 bytes
    expect_offset(b, 5);
  }
  // The edges of what UTF-8 may encode: a UTF-16 surrogate, a code point
  // past U+10FFFF, a five-byte lead; U+10FFFF itself is text.
  SUBCASE("a surrogate") {
    expect_offset(good.substr(0, 5) + "\xed\xa0\x80" + good, 5);
  }
  SUBCASE("past U+10FFFF") {
    expect_offset(good.substr(0, 5) + "\xf4\x90\x80\x80" + good, 5);
  }
  SUBCASE("a five-byte lead") {
    expect_offset(good.substr(0, 5) + "\xf8\x88\x80\x80\x80" + good, 5);
  }
  SUBCASE("U+10FFFF and U+FFFD are text") {
    const std::string b = good + "\xf4\x8f\xbf\xbf\xef\xbf\xbd" + good;
    write_bytes(path, std::vector<std::uint8_t>(b.begin(), b.end()));
    auto s = create_data_source("text", "path = " + lit(path) + "\n");
    CHECK_NOTHROW(s->setup({T, 256, 1}));
  }
}

TEST_CASE("text: vocab_size below 256 is a ConfigError and a too short file a DataError") {
  TempDir dir;
  const auto path = dir / "c.txt";
  const std::string text = utf8_corpus(1000);
  write_bytes(path, std::vector<std::uint8_t>(text.begin(), text.end()));
  {
    auto s = create_data_source("text", "path = " + lit(path) + "\n");
    const std::string msg = message_of<ConfigError>([&] { s->setup({8, 200, 1}); });
    CHECK(contains(msg, "vocab_size"));
    CHECK(contains(msg, "200"));
    CHECK(contains(msg, "256"));
  }
  {
    const auto short_path = dir / "short.txt";
    const std::string tiny = "just a few bytes\n";
    write_bytes(short_path, std::vector<std::uint8_t>(tiny.begin(), tiny.end()));
    auto s = create_data_source("text", "path = " + lit(short_path) + "\n");
    const std::string msg = message_of<DataError>([&] { s->setup({8, 256, 1}); });
    CHECK(contains(msg, short_path.string()));
    CHECK(contains(msg, "seq_len + 1"));
  }
  {
    auto s = create_data_source("text", "path = " + lit(dir / "missing.txt") + "\n");
    const std::string msg = message_of<DataError>([&] { s->setup({8, 256, 1}); });
    CHECK(contains(msg, (dir / "missing.txt").string()));
  }
  CHECK(contains(message_of<ConfigError>([] { create_data_source("text", ""); }), "path"));
}

// ---------------------------------------------------------------- TokenWindows

TEST_CASE(
    "TokenWindows: shuffled windows visit each window once per epoch, in a new order each epoch") {
  const int T = 10;
  const TokenWindows w({1001}, T, 42, true);  // 100 windows
  REQUIRE(w.count() == 100);
  std::vector<std::vector<std::uint64_t>> epochs;
  for (std::uint64_t e = 0; e < 3; ++e) {
    std::vector<std::uint64_t> order;
    std::set<std::uint64_t> seen;
    for (std::uint64_t i = 0; i < w.count(); ++i) {
      const std::uint64_t start = w.place(e * w.count() + i).offset;
      REQUIRE(start % T == 0);
      REQUIRE(start / T < w.count());
      REQUIRE(start + T + 1 <= 1001);  // a window of T + 1 tokens fits
      order.push_back(start / T);
      seen.insert(start / T);
    }
    CHECK(seen.size() == w.count());  // a permutation: every window exactly once
    epochs.push_back(order);
  }
  std::vector<std::uint64_t> identity(w.count());
  for (std::uint64_t i = 0; i < w.count(); ++i) identity[i] = i;
  CHECK(epochs[0] != identity);  // actually shuffled
  CHECK(epochs[0] != epochs[1]);
  CHECK(epochs[1] != epochs[2]);
  // Deterministic from the seed; another seed gives another order.
  const TokenWindows same({1001}, T, 42, true), other({1001}, T, 43, true);
  std::vector<std::uint64_t> o_same, o_other;
  for (std::uint64_t i = 0; i < w.count(); ++i) {
    o_same.push_back(same.place(i).offset / T);
    o_other.push_back(other.place(i).offset / T);
  }
  CHECK(o_same == epochs[0]);
  CHECK(o_other != epochs[0]);

  // Unshuffled: window i starts at i*T and epochs repeat the same order.
  const TokenWindows plain({1001}, T, 42, false);
  for (std::uint64_t i = 0; i < 250; ++i) CHECK(plain.place(i).offset == (i % 100) * T);
  // Overlap by one: n tokens give floor((n-1)/T) windows.
  CHECK(TokenWindows({1000}, T, 1, false).count() == 99);
  CHECK(TokenWindows({11}, T, 1, true).count() == 1);
  CHECK(TokenWindows({11}, T, 1, true).place(5).offset == 0);
}

TEST_CASE("TokenWindows over pieces: windows stay in their piece, an epoch mixes all pieces") {
  const int T = 10;
  // 5 windows, none (too short), 4, 3: 12 in all.
  const std::vector<std::uint64_t> pieces{51, 7, 41, 31};
  const TokenWindows w(pieces, T, 7, true);
  REQUIRE(w.count() == 12);
  std::set<std::pair<std::size_t, std::uint64_t>> seen;
  std::vector<std::size_t> order;
  for (std::uint64_t i = 0; i < 12; ++i) {
    const auto at = w.place(i);
    REQUIRE(at.piece < pieces.size());
    CHECK(at.piece != 1);
    CHECK(at.offset % T == 0);
    CHECK(at.offset + T + 1 <= pieces[at.piece]);  // within its piece
    seen.insert({at.piece, at.offset});
    order.push_back(at.piece);
  }
  CHECK(seen.size() == 12);  // every window of every piece once
  CHECK(order != std::vector<std::size_t>{0, 0, 0, 0, 0, 2, 2, 2, 2, 3, 3, 3});
  // Unshuffled: piece after piece, and the same as one piece's windows each.
  const TokenWindows plain(pieces, T, 7, false);
  CHECK(plain.place(4).piece == 0);
  CHECK(plain.place(5).piece == 2);
  CHECK(plain.place(5).offset == 0);
  CHECK(plain.place(11).piece == 3);
  CHECK(plain.place(11).offset == 20);
  CHECK(plain.place(12).piece == 0);  // the next epoch
  // One piece is the single stream it always was.
  const TokenWindows one({1001}, T, 42, true);
  CHECK(one.place(37).piece == 0);
}

// Every piece length around the window size's multiples, the boundary a
// shard's edge is: n tokens give floor((n - 1) / T) windows at offsets 0,
// T, 2T..., each inside its piece, the last one ending on the piece's last
// token exactly when n - 1 is a multiple of T; the next window starts the
// next piece.
TEST_CASE("TokenWindows at a piece's edge: every length from 0 to 4T + 2") {
  const int T = 8;
  for (std::uint64_t n = 0; n <= 4 * T + 2; ++n) {
    CAPTURE(n);
    const std::vector<std::uint64_t> pieces{n, 2 * T + 1};
    const TokenWindows w(pieces, T, 3, false);
    const std::uint64_t mine = n > 0 ? (n - 1) / T : 0;
    REQUIRE(w.count() == mine + 2);
    for (std::uint64_t i = 0; i < mine; ++i) {
      CHECK(w.place(i).piece == 0);
      CHECK(w.place(i).offset == i * T);
      CHECK(w.place(i).offset + T + 1 <= n);
    }
    if (mine > 0 && (n - 1) % T == 0) CHECK(w.place(mine - 1).offset + T + 1 == n);
    CHECK(w.place(mine).piece == 1);
    CHECK(w.place(mine).offset == 0);
    CHECK(w.place(mine + 1).offset == static_cast<std::uint64_t>(T));
    // Shuffled, an epoch is still every window once.
    const TokenWindows s(pieces, T, 3, true);
    std::set<std::pair<std::size_t, std::uint64_t>> seen;
    for (std::uint64_t i = 0; i < s.count(); ++i)
      seen.insert({s.place(i).piece, s.place(i).offset});
    CHECK(seen.size() == s.count());
  }
}

// ---------------------------------------------------------------- DataLoader

namespace {

// The rows of optimizer step `step`, ordered by global row, read by one
// DataLoader per rank.
struct LoaderSet {
  LoaderSet(const DataSource& src, int B, int T, int A, int W) : B_(B), T_(T), A_(A), W_(W) {
    for (int r = 0; r < W; ++r)
      ranks_.push_back(std::make_unique<DataLoader>(src, B, T, A, DataShare{r, W}));
  }
  std::vector<Pair> step() {
    std::vector<Pair> rows(static_cast<std::size_t>(B_ * A_ * W_));
    for (int r = 0; r < W_; ++r) {
      for (int a = 0; a < A_; ++a) {
        const Batch batch = ranks_[static_cast<std::size_t>(r)]->next();
        REQUIRE(batch.shape.batch == B_);
        REQUIRE(batch.shape.seq_len == T_);
        for (int b = 0; b < B_; ++b) {
          const std::size_t off = static_cast<std::size_t>(b * T_);
          Pair& p = rows[static_cast<std::size_t>((r * A_ + a) * B_ + b)];
          p.inputs.assign(batch.inputs + off, batch.inputs + off + static_cast<std::size_t>(T_));
          p.targets.assign(batch.targets + off, batch.targets + off + static_cast<std::size_t>(T_));
        }
      }
    }
    return rows;
  }
  int B_, T_, A_, W_;
  std::vector<std::unique_ptr<DataLoader>> ranks_;
};

std::vector<Pair> copy_batch(const Batch& batch) {
  std::vector<Pair> rows;
  for (int b = 0; b < batch.shape.batch; ++b) {
    const std::size_t off = static_cast<std::size_t>(b * batch.shape.seq_len);
    const std::size_t T = static_cast<std::size_t>(batch.shape.seq_len);
    rows.push_back({Seq(batch.inputs + off, batch.inputs + off + T),
                    Seq(batch.targets + off, batch.targets + off + T)});
  }
  return rows;
}

}  // namespace

TEST_CASE("DataLoader: a step reads the same global sequences at world sizes 1, 2 and 4") {
  const int T = 16, G = 8;
  auto src = make_source("synthetic", "", {T, 512, 11});
  struct Layout {
    int B, A, W;
  };
  const std::vector<Layout> layouts = {{8, 1, 1}, {2, 4, 1}, {4, 1, 2}, {2, 2, 2},
                                       {2, 1, 4}, {1, 2, 4}, {1, 8, 1}};
  std::vector<std::vector<std::vector<Pair>>> per_layout;
  for (const Layout l : layouts) {
    REQUIRE(l.B * l.A * l.W == G);
    LoaderSet set(*src, l.B, T, l.A, l.W);
    std::vector<std::vector<Pair>> steps;
    for (int s = 0; s < 4; ++s) steps.push_back(set.step());
    per_layout.push_back(std::move(steps));
  }
  // Reference: step s is global sequences [s*G, (s+1)*G) of the train split.
  for (int s = 0; s < 4; ++s) {
    std::vector<Pair> ref;
    for (int g = 0; g < G; ++g)
      ref.push_back(fetch(*src, Split::train, static_cast<std::uint64_t>(s * G + g), T));
    for (std::size_t l = 0; l < layouts.size(); ++l) {
      CAPTURE(s);
      CAPTURE(layouts[l].B);
      CAPTURE(layouts[l].A);
      CAPTURE(layouts[l].W);
      CHECK(per_layout[l][static_cast<std::size_t>(s)] == ref);
    }
  }
  // Consecutive steps are different data.
  CHECK_FALSE(per_layout[0][0] == per_layout[0][1]);
}

TEST_CASE("DataLoader: seek(position()) reproduces the following batches") {
  const int T = 12, B = 2, A = 3, W = 2;
  auto src = make_source("synthetic", "", {T, 512, 5});
  DataLoader first(*src, B, T, A, {1, W});
  CHECK(first.position() == 0);
  for (int k = 0; k < 7; ++k) first.next();
  const std::uint64_t pos = first.position();
  CHECK(pos == 7);
  std::vector<std::vector<Pair>> expected;
  for (int k = 0; k < 5; ++k) expected.push_back(copy_batch(first.next()));
  CHECK(first.position() == 12);

  // A fresh loader resumed at the saved position.
  DataLoader resumed(*src, B, T, A, {1, W});
  resumed.next();  // some unrelated progress first, with a prefetch in flight
  resumed.seek(pos);
  CHECK(resumed.position() == pos);
  for (int k = 0; k < 5; ++k) {
    CAPTURE(k);
    CHECK(copy_batch(resumed.next()) == expected[static_cast<std::size_t>(k)]);
  }
  // The same loader rewound.
  first.seek(pos);
  for (int k = 0; k < 5; ++k)
    CHECK(copy_batch(first.next()) == expected[static_cast<std::size_t>(k)]);
  // Micro-step 7 of rank 1 is step 2, accumulation 1: rows (1*3 + 1)*2 of step 2.
  const std::uint64_t G = B * A * W;
  CHECK(expected[0][0] == fetch(*src, Split::train, 2 * G + 8, T));
  CHECK(expected[0][1] == fetch(*src, Split::train, 2 * G + 9, T));
  // seek(0) starts over.
  resumed.seek(0);
  DataLoader fresh(*src, B, T, A, {1, W});
  CHECK(copy_batch(resumed.next()) == copy_batch(fresh.next()));
}

TEST_CASE("DataLoader: val(j) is the same on every call and partitions the val split over ranks") {
  const int T = 12, B = 3, W = 2;
  auto src = make_source("synthetic", "", {T, 512, 9});
  DataLoader r0(*src, B, T, 1, {0, W}), r1(*src, B, T, 1, {1, W});
  const auto v0 = copy_batch(r0.val(0));
  const auto v1 = copy_batch(r0.val(1));
  CHECK(v0 != v1);
  r0.next();
  r0.next();
  CHECK(copy_batch(r0.val(0)) == v0);  // training progress does not move it
  CHECK(copy_batch(r0.val(1)) == v1);
  CHECK(copy_batch(r0.val(0)) == v0);
  // Val batch j of rank r is val sequences [(j*W + r)*B, +B).
  for (int j = 0; j < 3; ++j) {
    const auto a = copy_batch(r0.val(j));
    const auto b = copy_batch(r1.val(j));
    for (int i = 0; i < B; ++i) {
      CHECK(a[static_cast<std::size_t>(i)] ==
            fetch(*src, Split::val, static_cast<std::uint64_t>((j * W + 0) * B + i), T));
      CHECK(b[static_cast<std::size_t>(i)] ==
            fetch(*src, Split::val, static_cast<std::uint64_t>((j * W + 1) * B + i), T));
    }
  }
  // Val data is not training data.
  CHECK(copy_batch(r1.next()) != copy_batch(r1.val(0)));
}

TEST_CASE("DataLoader: a sequence group's ranks read their data rank's rows, each its slice") {
  const int T = 24, B = 2, A = 2, W = 2;
  auto src = make_source("synthetic", "", {T, 512, 13});
  for (const int S : {2, 3, 4}) {
    const int slice = T / S;
    for (int r = 0; r < W; ++r)
      for (int k = 0; k < S; ++k) {
        DataLoader dl(*src, B, T, A, {r, W, {S, 1}, {k, 0}});
        for (int m = 0; m < 5; ++m) {  // micro-steps across two optimizer steps
          const Batch batch = m < 4 ? dl.next() : dl.val(1);
          CHECK(batch.shape.seq_len == slice);
          CHECK(batch.shape.split.shards() == S);
          for (int b = 0; b < B; ++b) {
            const std::uint64_t row =
                m < 4 ? static_cast<std::uint64_t>((m / A) * B * A * W + (r * A + m % A) * B + b)
                      : static_cast<std::uint64_t>((1 * W + r) * B + b);
            const Pair whole = fetch(*src, m < 4 ? Split::train : Split::val, row, T);
            const auto at = static_cast<std::ptrdiff_t>(k * slice);
            const std::size_t off = static_cast<std::size_t>(b * slice);
            CAPTURE(S);
            CAPTURE(k);
            CAPTURE(m);
            CHECK(Seq(batch.inputs + off, batch.inputs + off + static_cast<std::size_t>(slice)) ==
                  Seq(whole.inputs.begin() + at, whole.inputs.begin() + at + slice));
            CHECK(Seq(batch.targets + off, batch.targets + off + static_cast<std::size_t>(slice)) ==
                  Seq(whole.targets.begin() + at, whole.targets.begin() + at + slice));
          }
        }
      }
  }
}

// Ring attention's layout, and Ulysses inside it, written out here rather
// than through shard_spans: ring rank r of R holds chunks r and 2R-1-r of
// 2R, in that order, and Ulysses rank k of S the k-th of S slices of that
// pair (a slice may straddle the two chunks); the ranks of a group
// together hold every token once.
TEST_CASE(
    "DataLoader: a ring's ranks each read the mirrored pair of chunks of a row, or their "
    "Ulysses slice of it") {
  const int T = 24, B = 2, A = 1, W = 2;
  auto src = make_source("synthetic", "", {T, 512, 13});
  for (const SequenceSplit split :
       {SequenceSplit{1, 2}, SequenceSplit{1, 3}, SequenceSplit{2, 2}, SequenceSplit{3, 2}}) {
    const int S = split.sequence, R = split.context, c = T / (2 * R), L = T / (S * R);
    for (int r = 0; r < W; ++r) {
      std::vector<int> seen(static_cast<std::size_t>(B * T), 0);
      for (int ring = 0; ring < R; ++ring)
        for (int k = 0; k < S; ++k) {
          DataLoader dl(*src, B, T, A, {r, W, split, {k, ring}});
          const Batch batch = dl.next();
          CHECK(batch.shape.seq_len == L);
          CHECK(batch.shape.split == split);
          for (int b = 0; b < B; ++b) {
            const Pair whole = fetch(*src, Split::train, static_cast<std::uint64_t>(r * B + b), T);
            for (int i = 0; i < L; ++i) {
              const int in_pair = k * L + i;
              const int position =
                  in_pair < c ? ring * c + in_pair : (2 * R - 1 - ring) * c + in_pair - c;
              CAPTURE(S);
              CAPTURE(R);
              CAPTURE(k);
              CAPTURE(ring);
              CAPTURE(i);
              const std::size_t at = static_cast<std::size_t>(b * L + i);
              CHECK(batch.inputs[at] == whole.inputs[static_cast<std::size_t>(position)]);
              CHECK(batch.targets[at] == whole.targets[static_cast<std::size_t>(position)]);
              ++seen[static_cast<std::size_t>(b * T + position)];
            }
          }
        }
      CHECK(seen == std::vector<int>(static_cast<std::size_t>(B * T), 1));
    }
  }
}

namespace {

// A source that fails on train sequences from `bad` on, as a corrupt file would.
class FailingSource final : public DataSource {
 public:
  FailingSource(int T, std::uint64_t bad) : T_(T), bad_(bad) {}
  void setup(const DataSetup&) override {}
  DataInfo info() const override {
    return {"failing", std::nullopt, 16, {}, std::nullopt, std::nullopt, {}, {}, std::nullopt};
  }
  void fill(Split split, std::uint64_t index, std::int32_t* inputs,
            std::int32_t* targets) const override {
    if (split == Split::train && index >= bad_)
      throw DataError("failing.bin: bad token in sequence " + std::to_string(index));
    for (int t = 0; t < T_; ++t) {
      inputs[t] = static_cast<std::int32_t>(index % 16);
      targets[t] = static_cast<std::int32_t>((index + 1) % 16);
    }
  }

 private:
  int T_;
  std::uint64_t bad_;
};

}  // namespace

TEST_CASE("DataLoader: a DataError raised while prefetching comes out of next()") {
  const int T = 4, B = 2;
  const FailingSource src(T, 6);
  DataLoader dl(src, B, T, 1, {});
  for (int k = 0; k < 3; ++k) CHECK(copy_batch(dl.next())[0].inputs[0] == 2 * k);  // sequences 0..5
  const std::string msg = message_of<DataError>([&] { dl.next(); });
  CHECK(contains(msg, "failing.bin"));
  CHECK(contains(msg, "sequence 6"));
  // Seeking back to a good position recovers.
  dl.seek(1);
  CHECK(copy_batch(dl.next())[0].inputs[0] == 2);
  CHECK(dl.position() == 2);
}

TEST_CASE("data sources: fill from several threads at once gives the serial results") {
  TempDir dir;
  const auto tokens_path = dir / "t.bin";
  const auto text_path = dir / "t.txt";
  write_llmc_v1(tokens_path, token_stream(5000, 500));
  const std::string text = utf8_corpus(5000);
  write_bytes(text_path, std::vector<std::uint8_t>(text.begin(), text.end()));
  const int T = 32;
  const std::vector<std::shared_ptr<DataSource>> sources = {
      make_source("synthetic", "", {T, 512, 1}),
      make_source("tokens", "path = " + lit(tokens_path) + "\n", {T, 512, 1}),
      make_source("text", "path = " + lit(text_path) + "\n", {T, 512, 1})};
  for (const auto& src : sources) {
    CAPTURE(src->info().description);
    const int n = 200;
    std::vector<Pair> serial;
    for (int i = 0; i < n; ++i)
      serial.push_back(fetch(*src, Split::train, static_cast<std::uint64_t>(i), T));
    std::vector<std::vector<Pair>> parallel(4);
    std::vector<std::thread> threads;
    for (std::size_t w = 0; w < parallel.size(); ++w)
      threads.emplace_back([&, w] {
        for (int i = 0; i < n; ++i)
          parallel[w].push_back(fetch(*src, Split::train, static_cast<std::uint64_t>(i), T));
      });
    for (auto& t : threads) t.join();
    for (const auto& p : parallel) CHECK(p == serial);
  }
}

namespace {

// Gives every row's first target as kIgnoreTarget without declaring masks.
class UndeclaredMasks final : public DataSource {
 public:
  void setup(const DataSetup&) override {}
  DataInfo info() const override {
    return {"undeclared", std::nullopt, 16, {}, std::nullopt, std::nullopt, {}, {}, std::nullopt};
  }
  void fill(Split, std::uint64_t, std::int32_t* inputs, std::int32_t* targets) const override {
    for (int t = 0; t < 4; ++t) inputs[t] = targets[t] = t;
    targets[0] = kIgnoreTarget;
  }
};

}  // namespace

// step_targets() is this rank's count of trained targets in the next
// grad_accum micro-batches: what next() then hands out, counted; every
// token where the source declares no masks. An ignored target from a
// source that declares none is refused as it is read.
TEST_CASE("DataLoader: a step's trained targets are counted ahead, undeclared masks refused") {
  const int T = 8, B = 2, A = 2, W = 2;
  auto masked = make_source("synthetic", "masked_prefix = 5\n", {T, 512, 3});
  REQUIRE(masked->info().masks);
  std::uint64_t all_ranks = 0, seen = 0;
  for (int r = 0; r < W; ++r) {
    DataLoader dl(*masked, B, T, A, {r, W});
    dl.next();  // step 0 ...
    dl.next();
    const std::uint64_t counted = dl.step_targets();  // ... and step 1, ahead
    std::uint64_t trained = 0;
    for (int a = 0; a < A; ++a) trained += DataLoader::trained(dl.next());
    CHECK(counted == trained);
    all_ranks += counted;
  }
  for (std::uint64_t g = 0; g < static_cast<std::uint64_t>(B * A * W); ++g) {
    const Pair p = fetch(*masked, Split::train, B * A * W + g, T);
    seen += static_cast<std::uint64_t>(std::count_if(p.targets.begin(), p.targets.end(),
                                                     [](int t) { return t != kIgnoreTarget; }));
  }
  CHECK(all_ranks == seen);
  CHECK(seen < static_cast<std::uint64_t>(B * A * W * T));  // some are masked

  auto plain = make_source("synthetic", "", {T, 512, 3});
  CHECK_FALSE(plain->info().masks);
  CHECK(DataLoader(*plain, B, T, A, {0, W}).step_targets() ==
        static_cast<std::uint64_t>(A * B * T));

  const UndeclaredMasks undeclared;
  DataLoader dl(undeclared, 1, 4, 1, {});
  const std::string msg = message_of<DataError>([&] { dl.next(); });
  CHECK(contains(msg, "ignored target (-100) at position 0"));
  CHECK(contains(msg, "without declaring masks"));
}

namespace {

// Rows of 6 tokens packing examples of 2 and 4 tokens (positions 0 1 0 1
// 2 3), or, `broken`, with a position that neither restarts nor counts on.
class Packed final : public DataSource {
 public:
  explicit Packed(bool broken) : broken_(broken) {}
  void setup(const DataSetup&) override {}
  DataInfo info() const override {
    DataInfo d;
    d.description = "packed";
    d.vocab_used = 16;
    d.segments = true;
    return d;
  }
  void fill(Split, std::uint64_t, std::int32_t* inputs, std::int32_t* targets) const override {
    for (int t = 0; t < 6; ++t) inputs[t] = targets[t] = t;
  }
  void fill_positions(Split, std::uint64_t, std::int32_t* positions) const override {
    const std::int32_t p[6] = {0, 1, 0, 1, broken_ ? 3 : 2, 3};
    std::copy(p, p + 6, positions);
  }

 private:
  bool broken_;
};

}  // namespace

// A source that declares segments: its positions reach the batch beside
// the ids, row by row, and positions that neither restart at 0 nor count
// on by one are refused as they are read, naming the sequence and token.
// The sources without segments leave Batch::positions null.
TEST_CASE("DataLoader: packed rows carry their positions, checked as they are read") {
  const Packed packed(false);
  DataLoader dl(packed, 2, 6, 1, {});
  const Batch b = dl.next();
  REQUIRE(b.positions != nullptr);
  CHECK(std::vector<std::int32_t>(b.positions, b.positions + 12) ==
        std::vector<std::int32_t>{0, 1, 0, 1, 2, 3, 0, 1, 0, 1, 2, 3});
  CHECK(dl.val(0).positions != nullptr);
  const Packed broken(true);
  DataLoader bad(broken, 1, 6, 1, {});
  const std::string msg = message_of<DataError>([&] { bad.next(); });
  CHECK(contains(msg, "sequence 0 position 3 at token 4 (after 1)"));
  auto plain = make_source("synthetic", "", {6, 512, 3});
  CHECK(DataLoader(*plain, 1, 6, 1, {}).next().positions == nullptr);
}

// document_mask: the tokens of a prepared corpus (its manifest names the
// separator each document starts with) come with positions that restart at
// every separator and at the window's start; without a manifest naming one
// the option is refused, naming the key.
TEST_CASE("tokens: document_mask restarts positions at each document's separator") {
  const TempDir dir;
  const std::uint32_t sep = 7;
  std::vector<std::uint32_t> tokens;
  for (int doc = 0; doc < 40; ++doc) {
    tokens.push_back(sep);
    for (int i = 0; i < 3 + doc % 5; ++i) tokens.push_back(20 + static_cast<std::uint32_t>(i));
  }
  write_llmc_v1(dir / "train.bin", tokens);
  auto refused = create_data_source(
      "tokens", "path = " + lit(dir / "train.bin") + "\ndocument_mask = true\nshuffle = false\n");
  CHECK(contains(message_of<ConfigError>([&] {
                   refused->setup({8, 64, 1, false});
                 }),
                 "t.toml:3:1: [data] document_mask needs the separator each document starts with"));
  std::ofstream(dir / "manifest.json") << R"({"format": "ztrain-prepare 1", "separator_id": 7})";
  auto s = make_source(
      "tokens", "path = " + lit(dir / "train.bin") + "\ndocument_mask = true\nshuffle = false\n",
      {8, 64, 1, false});
  CHECK(s->info().segments);
  for (std::uint64_t w = 0; w < 10; ++w) {
    const Pair p = fetch(*s, Split::train, w, 8);
    Seq positions(8, -1);
    s->fill_positions(Split::train, w, positions.data());
    for (int t = 0; t < 8; ++t) {
      INFO("window " << w << ", token " << t);
      const std::int32_t want = t == 0 || p.inputs[t] == static_cast<std::int32_t>(sep)
                                    ? 0
                                    : positions[static_cast<std::size_t>(t) - 1] + 1;
      CHECK(positions[static_cast<std::size_t>(t)] == want);
    }
  }
  auto unmasked =
      make_source("tokens", "path = " + lit(dir / "train.bin") + "\n", {8, 64, 1, false});
  CHECK_FALSE(unmasked->info().segments);
}
