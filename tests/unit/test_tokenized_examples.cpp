// [data] tokenized_path: the sft source's examples saved by one read and
// loaded by the next, equal to what the datasets give; a load refused
// where it would train something else (a key that shapes the examples, the
// tokenizer, a data file changed since), a directory that is not ztrain's,
// files cut short; a save that cannot be made.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "support.h"
#include "text/sft_reader.h"
#include "train/tokenized_examples.h"
#include "ztrain/error.h"

namespace {

using namespace ztrain;
using ztrain::test::message_of;
using ztrain::test::source_dir;
using ztrain::test::TempDir;
namespace fs = std::filesystem;

const fs::path kData = source_dir() / "tests" / "data";

struct Fixture {
  TempDir model, data, out;
  Fixture() {
    fs::copy_file(kData / "tokenizers" / "byte_level.json", model / "tokenizer.json");
    fs::copy_file(kData / "chat_templates" / "qwen2_5.jinja", model / "chat_template.jinja");
    for (const char* f : {"dataset_info.json", "alpaca_en_demo.json", "alpaca_history.jsonl"})
      fs::copy_file(kData / "llamafactory" / f, data / f);
  }
  SftRequest request() const {
    SftRequest r;
    r.dataset_dir = data.path().string();
    r.datasets = {"alpaca_en_demo", "alpaca_history"};
    r.model_dir = model.path().string();
    r.cutoff_len = 600;
    r.tokenized_path = (out / "tok").string();
    return r;
  }
};

void check_same(const SftExamples& a, const SftExamples& b) {
  CHECK(a.input_ids == b.input_ids);
  CHECK(a.labels == b.labels);
  CHECK(a.starts == b.starts);
  CHECK(a.where == b.where);
  CHECK(a.bad_rows == b.bad_rows);
  CHECK(a.tokenizer_identity == b.tokenizer_identity);
  CHECK(a.chat_template == b.chat_template);
}

}  // namespace

TEST_CASE("tokenized_path: saved by the first read, loaded by the next, as the datasets give") {
  const Fixture f;
  const TokenizedReader reader(text::host_sft_reader());
  SftRequest plain = f.request();
  plain.tokenized_path.clear();
  const SftExamples direct = text::read_sft_examples(plain);
  REQUIRE(direct.count() >= 5);
  check_same(reader.read(f.request()), direct);
  for (const char* file : {"tokenized.json", "input_ids.bin", "labels.bin"})
    CHECK(fs::exists(f.out / "tok" / file));
  const auto saved = fs::last_write_time(f.out / "tok" / "labels.bin");
  check_same(reader.read(f.request()), direct);
  CHECK(fs::last_write_time(f.out / "tok" / "labels.bin") == saved);  // loaded, not rewritten
}

TEST_CASE("tokenized_path: a load that would train something else is refused, naming why") {
  const Fixture f;
  const TokenizedReader reader(text::host_sft_reader());
  reader.read(f.request());
  SftRequest r = f.request();
  r.cutoff_len = 300;
  CHECK(message_of<ConfigError>([&] {
          reader.read(r);
        }).find("[data] cutoff_len was 600 when they were saved, and is 300 now") !=
        std::string::npos);
  r = f.request();
  r.datasets = {"alpaca_en_demo"};
  CHECK(message_of<ConfigError>([&] { reader.read(r); }).find("[data] dataset was") !=
        std::string::npos);
  std::ofstream(f.data / "alpaca_history.jsonl", std::ios::app) << "\n";
  CHECK(message_of<ConfigError>([&] {
          reader.read(f.request());
        }).find("alpaca_history.jsonl has changed (or is gone) since") != std::string::npos);
  fs::copy_file(kData / "llamafactory" / "alpaca_history.jsonl", f.data / "alpaca_history.jsonl",
                fs::copy_options::overwrite_existing);
  fs::copy_file(kData / "tokenizers" / "byte_level_chat.json", f.model / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  CHECK(message_of<ConfigError>([&] {
          reader.read(f.request());
        }).find("the model directory's tokenizer is not the one they were encoded with") !=
        std::string::npos);
}

TEST_CASE("tokenized_path: foreign, cut short or unwritable directories are refused") {
  const Fixture f;
  const TokenizedReader reader(text::host_sft_reader());
  SftRequest r = f.request();
  fs::create_directories(f.out / "arrow");
  std::ofstream(f.out / "arrow" / "dataset_dict.json") << "{}";
  r.tokenized_path = (f.out / "arrow").string();
  CHECK(message_of<ConfigError>([&] { reader.read(r); }).find("holds no tokenized.json") !=
        std::string::npos);
  reader.read(f.request());
  fs::resize_file(f.out / "tok" / "labels.bin", 8);
  CHECK(message_of<DataError>([&] { reader.read(f.request()); }).find("labels.bin: not the") !=
        std::string::npos);
  std::ofstream(f.out / "file") << "x";
  r.tokenized_path = (f.out / "file" / "tok").string();
  CHECK(message_of<DataError>([&] { reader.read(r); }).find("cannot be made") != std::string::npos);
}
