// The sft data source: LLaMA-Factory's datasets (tests/data/llamafactory)
// through the host's reader (a model directory with the byte-level test
// tokenizer and Qwen2.5's chat template), laid out one example a row.
//
// The reader's own output is the reference (its rendering and masks are
// checked against LLaMA-Factory and transformers in test_sft_encoding):
// what is checked here is the layout, each row an example's tokens 0..L-2
// as inputs and its labels 1..L-1 as targets, then padding the loss skips;
// every example once an epoch, in a new order each epoch; the held-out
// examples apart from the trained ones; and what is refused.
#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support.h"
#include "text/sft_reader.h"
#include "ztrain/data.h"
#include "ztrain/error.h"

namespace {

using namespace ztrain;
using ztrain::test::create_data_source;
using ztrain::test::message_of;
using ztrain::test::source_dir;
using ztrain::test::TempDir;

using Ids = std::vector<std::int32_t>;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A model directory: the byte-level tokenizer and Qwen2.5's template.
struct ModelDir {
  TempDir dir;
  ModelDir() {
    const auto data = source_dir() / "tests" / "data";
    std::filesystem::copy_file(data / "tokenizers" / "byte_level.json", dir / "tokenizer.json");
    std::filesystem::copy_file(data / "chat_templates" / "qwen2_5.jinja",
                               dir / "chat_template.jinja");
  }
};

const std::string kDatasets =
    "dataset_dir = '" + (source_dir() / "tests" / "data" / "llamafactory").string() +
    "'\ndataset = [\"alpaca_en_demo\", \"glaive_toolcall_en_demo\", \"openai_messages\"]\n";

DataSetup setup_of(const ModelDir& m, int seq_len, bool evaluates = false) {
  DataSetup s;
  s.seq_len = seq_len;
  s.vocab_size = 4096;
  s.seed = 7;
  s.evaluates = evaluates;
  s.model_dir = m.dir.path().string();
  s.sft = &text::host_sft_reader();
  return s;
}

// The reader's examples for the same datasets, options and directory.
SftExamples reference(const ModelDir& m, std::size_t cutoff_len) {
  SftRequest r;
  r.dataset_dir = (source_dir() / "tests" / "data" / "llamafactory").string();
  r.datasets = {"alpaca_en_demo", "glaive_toolcall_en_demo", "openai_messages"};
  r.model_dir = m.dir.path().string();
  r.cutoff_len = cutoff_len;
  return text::read_sft_examples(r);
}

struct Row {
  Ids inputs, targets;
};

Row row_at(const DataSource& src, Split split, std::uint64_t index, int T) {
  Row r{Ids(static_cast<std::size_t>(T), -7), Ids(static_cast<std::size_t>(T), -7)};
  src.fill(split, index, r.inputs.data(), r.targets.data());
  return r;
}

// The example a row holds: the one whose tokens 0..L-2 are its inputs and
// labels 1..L-1 its targets, followed by padding (input 0, target -100).
// -1 when none is.
long example_in(const Row& r, const SftExamples& e) {
  for (std::size_t i = 0; i < e.count(); ++i) {
    const std::size_t n = e.length(i) - 1, b = e.starts[i];
    if (n > r.inputs.size()) continue;
    const bool tokens = std::equal(r.inputs.begin(), r.inputs.begin() + static_cast<long>(n),
                                   e.input_ids.begin() + static_cast<long>(b));
    const bool labels = std::equal(r.targets.begin(), r.targets.begin() + static_cast<long>(n),
                                   e.labels.begin() + static_cast<long>(b + 1));
    const bool padded = std::all_of(r.inputs.begin() + static_cast<long>(n), r.inputs.end(),
                                    [](std::int32_t x) { return x == 0; }) &&
                        std::all_of(r.targets.begin() + static_cast<long>(n), r.targets.end(),
                                    [](std::int32_t x) { return x == kIgnoreTarget; });
    if (tokens && labels && padded) return static_cast<long>(i);
  }
  return -1;
}

TEST_CASE("sft: one example a row, every example once an epoch, a new order each epoch") {
  const ModelDir m;
  const int T = 600;
  const SftExamples e = reference(m, T + 1);
  REQUIRE(e.count() >= 6);
  auto src = create_data_source("sft", kDatasets);
  src->setup(setup_of(m, T));
  const DataInfo info = src->info();
  CHECK(info.masks);
  REQUIRE(info.train_sequences == e.count());
  CHECK_FALSE(info.val_sequences.has_value());
  std::vector<std::vector<long>> epochs(2);
  for (std::uint64_t i = 0; i < 2 * e.count(); ++i) {
    const long at = example_in(row_at(*src, Split::train, i, T), e);
    REQUIRE(at >= 0);
    epochs[i / e.count()].push_back(at);
  }
  for (auto order : epochs) {
    std::sort(order.begin(), order.end());
    for (std::size_t i = 0; i < order.size(); ++i) CHECK(order[i] == static_cast<long>(i));
  }
  CHECK(epochs[0] != epochs[1]);
  auto in_order = create_data_source("sft", kDatasets + "shuffle = false\n");
  in_order->setup(setup_of(m, T));
  for (std::uint64_t i = 0; i < e.count(); ++i)
    CHECK(example_in(row_at(*in_order, Split::train, i, T), e) == static_cast<long>(i));
}

TEST_CASE("sft: cutoff_len cuts the examples as the reader does, seq_len + 1 unless given") {
  const ModelDir m;
  for (const auto& [T, cutoff] : {std::pair{63, 0}, std::pair{100, 64}}) {
    const std::size_t kept = cutoff ? static_cast<std::size_t>(cutoff) : T + 1u;
    const SftExamples e = reference(m, kept);
    std::size_t longest = 0;
    for (std::size_t i = 0; i < e.count(); ++i) longest = std::max(longest, e.length(i));
    CHECK(longest == kept);  // some example is cut to exactly cutoff_len
    auto src = create_data_source(
        "sft", kDatasets + "shuffle = false\ncutoff_len = " + std::to_string(cutoff) + "\n");
    src->setup(setup_of(m, T));
    for (std::uint64_t i = 0; i < e.count(); ++i)
      CHECK(example_in(row_at(*src, Split::train, i, T), e) == static_cast<long>(i));
  }
}

TEST_CASE("sft: val_size holds out examples chosen by the seed, apart from the trained ones") {
  const ModelDir m;
  const int T = 600;
  const SftExamples e = reference(m, T + 1);
  auto src = create_data_source("sft", kDatasets + "val_size = 0.25\n");
  src->setup(setup_of(m, T, true));
  const DataInfo info = src->info();
  const std::size_t held = (e.count() + 3) / 4;
  REQUIRE(info.val_sequences == held);
  REQUIRE(info.train_sequences == e.count() - held);
  std::set<long> val, train;
  for (std::uint64_t i = 0; i < held; ++i)
    val.insert(example_in(row_at(*src, Split::val, i, T), e));
  for (std::uint64_t i = 0; i < e.count() - held; ++i)
    train.insert(example_in(row_at(*src, Split::train, i, T), e));
  CHECK(val.size() == held);
  CHECK(train.size() == e.count() - held);
  CHECK_FALSE(val.count(-1));
  CHECK_FALSE(train.count(-1));
  for (long v : val) CHECK_FALSE(train.count(v));
}

TEST_CASE("sft: bad rows are named in the notes, a dataset of bad rows alone stops setup") {
  const ModelDir m;
  auto src = create_data_source(
      "sft", "dataset_dir = '" + (source_dir() / "tests" / "data" / "llamafactory").string() +
                 "'\ndataset = [\"alpaca_en_demo\", \"bad_rows\"]\n");
  src->setup(setup_of(m, 600));
  const DataInfo info = src->info();
  REQUIRE(info.notes.size() == 6);
  CHECK(info.notes[0] == "data: 5 bad rows are not trained on:");
  CHECK(contains(info.notes[2], "bad_rows.json:26: the answer is empty"));
  CHECK(contains(info.description, "template " + (m.dir / "chat_template.jinja").string()));
  CHECK(info.chat_template == (m.dir / "chat_template.jinja").string());
  CHECK(info.tokenizer == (m.dir / "tokenizer.json").string());
  CHECK(std::find(info.files.begin(), info.files.end(), info.tokenizer) != info.files.end());

  const TempDir d;
  std::ofstream(d / "dataset_info.json") << R"({"broken": {"file_name": "broken.jsonl"}})";
  std::ofstream(d / "broken.jsonl") << R"({"instruction": "q", "output": ""})"
                                    << "\n"
                                    << R"({"instruction": "r", "output": ""})"
                                    << "\n";
  auto broken = create_data_source(
      "sft", "dataset_dir = '" + d.path().string() + "'\ndataset = \"broken\"\n");
  const std::string msg = message_of<DataError>([&] { broken->setup(setup_of(m, 600)); });
  CHECK(contains(msg, "no example of 2 rows is left to train on"));
  CHECK(contains(msg, "broken.jsonl:1: the answer is empty"));
}

// Best-fit decreasing as a plain loop: the longest example first (ties in
// file order), into the open row with the least room that holds it, else a
// new row; each row's examples in the order placed.
std::vector<std::vector<long>> best_fit_reference(const SftExamples& e, std::size_t T) {
  std::vector<long> order(e.count());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<long>(i);
  const auto places = [&](long i) { return e.length(static_cast<std::size_t>(i)) - 1; };
  std::stable_sort(order.begin(), order.end(),
                   [&](long a, long b) { return places(a) > places(b); });
  std::vector<std::vector<long>> rows;
  std::vector<std::size_t> left;
  for (long i : order) {
    std::size_t best = rows.size();
    for (std::size_t r = 0; r < rows.size(); ++r)
      if (left[r] >= places(i) && (best == rows.size() || left[r] < left[best])) best = r;
    if (best == rows.size()) {
      rows.emplace_back();
      left.push_back(T);
    }
    rows[best].push_back(i);
    left[best] -= places(i);
  }
  return rows;
}

// The examples a packed row holds, in order, read back from its tokens,
// targets and positions (each example from position 0, its tokens
// 0..L-2 and labels 1..L-1); -1 for a stretch that is no example. The
// padding after them must be input 0, target -100.
std::vector<long> examples_in(const Row& r, const Ids& positions, const SftExamples& e) {
  std::vector<long> found;
  std::size_t at = 0;
  const std::size_t T = r.inputs.size();
  while (at < T) {
    std::size_t end = at + 1;
    while (end < T && positions[end] != 0) ++end;
    const bool padding = std::all_of(r.inputs.begin() + static_cast<long>(at), r.inputs.end(),
                                     [](std::int32_t x) { return x == 0; }) &&
                         std::all_of(r.targets.begin() + static_cast<long>(at), r.targets.end(),
                                     [](std::int32_t x) { return x == kIgnoreTarget; });
    if (padding && end == T) break;
    long match = -1;
    for (std::size_t i = 0; i < e.count() && match < 0; ++i) {
      const std::size_t n = e.length(i) - 1, b = e.starts[i];
      if (n != end - at) continue;
      if (std::equal(e.input_ids.begin() + static_cast<long>(b),
                     e.input_ids.begin() + static_cast<long>(b + n),
                     r.inputs.begin() + static_cast<long>(at)) &&
          std::equal(e.labels.begin() + static_cast<long>(b + 1),
                     e.labels.begin() + static_cast<long>(b + 1 + n),
                     r.targets.begin() + static_cast<long>(at)))
        match = static_cast<long>(i);
    }
    found.push_back(match);
    for (std::size_t t = at; t < end; ++t) CHECK(positions[t] == static_cast<int>(t - at));
    at = end;
  }
  return found;
}

TEST_CASE("sft: packing places the examples best-fit decreasing, positions restarting") {
  const ModelDir m;
  const int T = 600;
  const SftExamples e = reference(m, T + 1);
  auto src = create_data_source("sft", kDatasets + "packing = true\nshuffle = false\n");
  src->setup(setup_of(m, T));
  const DataInfo info = src->info();
  CHECK(info.segments);
  const auto expected = best_fit_reference(e, T);
  REQUIRE(info.train_sequences == expected.size());
  CHECK(expected.size() < e.count());  // several examples share rows
  CHECK(contains(info.description, "packed into " + std::to_string(expected.size()) + " rows"));
  for (std::uint64_t r = 0; r < expected.size(); ++r) {
    INFO("row " << r);
    const Row row = row_at(*src, Split::train, r, T);
    Ids positions(static_cast<std::size_t>(T), -7);
    src->fill_positions(Split::train, r, positions.data());
    CHECK(examples_in(row, positions, e) == expected[r]);
  }
  // Shuffled, every row once an epoch, in a new order each epoch.
  auto shuffled = create_data_source("sft", kDatasets + "packing = true\n");
  shuffled->setup(setup_of(m, T));
  std::vector<std::set<std::vector<long>>> epochs(2);
  for (std::uint64_t i = 0; i < 2 * expected.size(); ++i) {
    Ids positions(static_cast<std::size_t>(T));
    shuffled->fill_positions(Split::train, i, positions.data());
    epochs[i / expected.size()].insert(
        examples_in(row_at(*shuffled, Split::train, i, T), positions, e));
  }
  const std::set<std::vector<long>> all(expected.begin(), expected.end());
  CHECK(epochs[0] == all);
  CHECK(epochs[1] == all);
}

TEST_CASE("sft: refused before reading, naming the key") {
  const ModelDir m;
  const auto refused = [&](const std::string& extra, DataSetup s) {
    auto src = create_data_source("sft", kDatasets + extra);
    return message_of<ConfigError>([&] { src->setup(s); });
  };
  const std::string unbuilt = refused("template = \"mistral\"\n", setup_of(m, 600));
  CHECK(contains(unbuilt,
                 "[data] template \"mistral\" is not one of LLaMA-Factory's templates "
                 "ztrain builds (llama3, qwen, qwen3, qwen3_nothink"));
  CHECK(unbuilt.rfind("t.toml:4:1: ", 0) == 0);  // led by the key's place in the run file
  CHECK(contains(refused("default_system = \"Be brief.\"\n", setup_of(m, 600)),
                 "[data] default_system replaces a LLaMA-Factory template's default system "
                 "message; with template \"auto\" the Jinja template decides it"));
  CHECK(contains(refused("cutoff_len = 102\n", setup_of(m, 100)),
                 "[data] cutoff_len 102 needs rows of cutoff_len - 1 = 101 positions"));
  DataSetup no_model = setup_of(m, 600);
  no_model.model_dir.clear();
  CHECK(contains(refused("", no_model), "set [model] init_from"));
  CHECK(contains(refused("", setup_of(m, 600, true)), "[data] val_size = 0 holds no example out"));
  const TempDir bare;
  DataSetup no_template = setup_of(m, 600);
  std::filesystem::copy_file(m.dir / "tokenizer.json", bare / "tokenizer.json");
  no_template.model_dir = bare.path().string();
  CHECK(contains(refused("", no_template), "chat_template"));
}

// A cutoff_len so short that no answer keeps a token: every example is a
// bad row, named with why, and setup stops.
TEST_CASE("sft: examples whose answer is cut away are bad rows, not examples") {
  const ModelDir m;
  auto src = create_data_source("sft", kDatasets + "cutoff_len = 1\n");
  const std::string msg = message_of<DataError>([&] { src->setup(setup_of(m, 8)); });
  INFO(msg);
  CHECK(contains(msg, "[data] dataset: no example of "));
  CHECK(contains(msg, "nothing left to train on within cutoff_len 1 (the answer is cut away)"));
}

TEST_CASE("sft: a token id past the model's vocabulary is a DataError naming the tokenizer") {
  const ModelDir m;
  DataSetup s = setup_of(m, 600);
  s.vocab_size = 300;
  auto src = create_data_source("sft", kDatasets);
  const std::string msg = message_of<DataError>([&] { src->setup(s); });
  CHECK(contains(msg, "tokenizer.json gives token id"));
  CHECK(contains(msg, "[model] vocab_size is 300"));
}

}  // namespace

// stage pt: the reader's blocks (held to LLaMA-Factory in
// test_pretrain_encoding), one a row, attention across the documents in
// it (no segments), every block once an epoch.
TEST_CASE("sft: stage pt lays each of the reader's blocks in a row") {
  const ModelDir m;
  std::ofstream(m.dir / "tokenizer_config.json") << R"({"eos_token": "<|endoftext|>"})";
  const int T = 128;
  SftRequest r;
  r.dataset_dir = (source_dir() / "tests" / "data" / "llamafactory").string();
  r.datasets = {"c4_demo"};
  r.model_dir = m.dir.path().string();
  r.cutoff_len = T + 1;
  r.pretrain.on = true;
  const SftExamples e = text::read_sft_examples(r);
  REQUIRE(e.count() > 50);
  auto src = create_data_source(
      "sft", "dataset_dir = '" + r.dataset_dir + "'\ndataset = \"c4_demo\"\nstage = \"pt\"\n");
  src->setup(setup_of(m, T));
  const DataInfo info = src->info();
  CHECK_FALSE(info.segments);
  CHECK(info.train_sequences == e.count());
  CHECK(contains(info.description, "pt c4_demo: " + std::to_string(e.count()) +
                                       " blocks of 129 tokens (0 held out)"));
  std::set<long> seen;
  for (std::uint64_t i = 0; i < e.count(); ++i)
    seen.insert(example_in(row_at(*src, Split::train, i, T), e));
  CHECK(seen.size() == e.count());
  CHECK(seen.count(-1) == 0);
  auto unpacked =
      create_data_source("sft", "dataset_dir = '" + r.dataset_dir +
                                    "'\ndataset = \"c4_demo\"\nstage = \"pt\"\npacking = false\n");
  unpacked->setup(setup_of(m, T));
  CHECK(unpacked->info().train_sequences == 10);  // one document a row
}

// eval_dataset: its examples, read as the training's are, are every
// evaluation row, and none of them trains; every training example trains.
TEST_CASE("sft: eval_dataset's examples are the held-out ones, the datasets' all train") {
  const ModelDir m;
  const int T = 600;
  const SftExamples train = reference(m, T + 1);
  SftRequest r;
  r.dataset_dir = (source_dir() / "tests" / "data" / "llamafactory").string();
  r.datasets = {"alpaca_history"};
  r.model_dir = m.dir.path().string();
  r.cutoff_len = T + 1;
  const SftExamples eval = text::read_sft_examples(r);
  REQUIRE(eval.count() == 2);
  auto src = create_data_source("sft", kDatasets + "eval_dataset = \"alpaca_history\"\n");
  src->setup(setup_of(m, T, true));
  const DataInfo info = src->info();
  CHECK(info.train_sequences == train.count());
  REQUIRE(info.val_sequences == std::optional<std::uint64_t>(2));
  std::set<long> trained, evaluated;
  for (std::uint64_t i = 0; i < train.count(); ++i)
    trained.insert(example_in(row_at(*src, Split::train, i, T), train));
  for (std::uint64_t i = 0; i < 2; ++i)
    evaluated.insert(example_in(row_at(*src, Split::val, i, T), eval));
  CHECK(trained.size() == train.count());
  CHECK(trained.count(-1) == 0);
  CHECK(evaluated == std::set<long>{0, 1});
  CHECK(contains(info.description, "evaluated on alpaca_history"));
  CHECK(contains(message_of<ConfigError>([&] {
                   create_data_source("sft", kDatasets +
                                                 "eval_dataset = \"alpaca_history\"\n"
                                                 "val_size = 0.1\n");
                 }),
                 "[data] val_size and eval_dataset both hold examples out"));
}
