// `ztrain prepare` (commands/prepare.h): the shards hold each document's
// separator and ids, in input order, whatever the thread count; the held-
// out split by token count and by fraction; the manifest's counts and the
// tokenizer's identity; empty inputs, bytes that are not UTF-8 and a
// validation split that takes everything refused, leaving nothing behind.
#include <doctest/doctest.h>

#include <oneapi/tbb/global_control.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/hf_export.h"
#include "commands/prepare.h"
#include "io/durable_file.h"
#include "support.h"
#include "text/tokenizer.h"

using namespace ztrain;

namespace {

std::vector<std::string> documents() {
  std::ifstream in(test::source_dir() / "tests/data/tokenizers/corpus.txt");
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::vector<std::string> docs;
  for (std::size_t i = 0; i < 200; ++i)
    docs.push_back(lines[i % lines.size()] + "\n" + lines[(i * 7 + 3) % lines.size()]);
  return docs;
}

std::vector<std::int32_t> shard_ids(const std::filesystem::path& file) {
  const std::string raw = read_whole_file(file);
  std::vector<std::int32_t> ids;
  for (std::size_t at = 1024; at + 1 < raw.size(); at += 2)
    ids.push_back(static_cast<unsigned char>(raw[at]) |
                  (static_cast<unsigned char>(raw[at + 1]) << 8));
  return ids;
}

}  // namespace

TEST_CASE("prepare: each document's separator and ids in input order, at any thread count") {
  test::TempDir dir;
  const auto docs = documents();
  {
    std::ofstream out(dir / "docs.jsonl");
    for (const auto& d : docs) out << nlohmann::json{{"text", d}}.dump() << "\n";
  }
  const auto tok_file = test::source_dir() / "tests/data/tokenizers/byte_level.json";
  PrepareArgs a;
  a.tokenizer = tok_file;
  a.inputs = {(dir / "docs.jsonl").string()};
  a.separator = "<|endoftext|>";
  a.shard_tokens = 1000;
  std::ostringstream log;
  a.out = dir / "many";
  REQUIRE(prepare(a, log) == 0);
  {
    const oneapi::tbb::global_control one(oneapi::tbb::global_control::max_allowed_parallelism, 1);
    a.out = dir / "one";
    REQUIRE(prepare(a, log) == 0);
  }
  const auto tok = text::load_tokenizer(tok_file);
  std::vector<std::int32_t> want;
  for (const auto& d : docs) {
    want.push_back(0);
    const auto ids = tok->encode(d);
    want.insert(want.end(), ids.begin(), ids.end());
  }
  std::vector<std::int32_t> got;
  std::size_t shards = 0;
  for (; std::filesystem::exists(dir / "many" / ("train_00000" + std::to_string(shards) + ".bin"));
       ++shards) {
    const std::string name = "train_00000" + std::to_string(shards) + ".bin";
    CHECK(read_whole_file(dir / "many" / name) == read_whole_file(dir / "one" / name));
    const auto ids = shard_ids(dir / "many" / name);
    CHECK(ids.size() <= 1000);
    got.insert(got.end(), ids.begin(), ids.end());
  }
  CHECK(shards == (want.size() + 999) / 1000);
  CHECK(got == want);
  const auto m = nlohmann::json::parse(read_whole_file(dir / "many" / "manifest.json"));
  CHECK(m["train"]["documents"] == 200);
  CHECK(m["train"]["tokens"] == want.size());
  CHECK(m["val"]["tokens"] == 0);
}

TEST_CASE("prepare: the held-out split by tokens (first documents) and by fraction (by index)") {
  test::TempDir dir;
  {
    std::ofstream out(dir / "docs.jsonl");
    for (const auto& d : documents()) out << nlohmann::json{{"text", d}}.dump() << "\n";
  }
  PrepareArgs a;
  a.tokenizer = test::source_dir() / "tests/data/tokenizers/sentencepiece.json";
  a.inputs = {(dir / "docs.jsonl").string()};
  a.separator = "<s>";
  std::ostringstream log;
  a.out = dir / "tokens";
  a.val_tokens = 500;
  REQUIRE(prepare(a, log) == 0);
  auto m = nlohmann::json::parse(read_whole_file(dir / "tokens" / "manifest.json"));
  CHECK(m["val"]["tokens"].get<std::uint64_t>() >= 500);
  CHECK(m["val"]["tokens"].get<std::uint64_t>() < 600);  // whole documents, stopped at 500
  const auto val = shard_ids(dir / "tokens" / "val_000000.bin");
  CHECK(val.front() == 1);  // <s>
  a.out = dir / "fraction";
  a.val_tokens = 0;
  a.val_fraction = 0.25;
  REQUIRE(prepare(a, log) == 0);
  m = nlohmann::json::parse(read_whole_file(dir / "fraction" / "manifest.json"));
  const double held = m["val"]["documents"].get<double>() / 200;
  CHECK(held > 0.15);
  CHECK(held < 0.35);
  CHECK(test::message_of<ConfigError>([&] {
          a.val_tokens = 10;
          prepare(a, log);
        }).find("excludes --val-tokens") != std::string::npos);
}

TEST_CASE("prepare: a SentencePiece model tokenizes, each document after its <s>") {
  test::TempDir dir;
  {
    std::ofstream out(dir / "docs.jsonl");
    for (const auto& d : documents()) out << nlohmann::json{{"text", d}}.dump() << "\n";
  }
  PrepareArgs a;
  a.tokenizer = test::source_dir() / "tests/data/tokenizers/sp_bpe.model";
  a.inputs = {(dir / "docs.jsonl").string()};
  a.out = dir / "sp";
  std::ostringstream log;
  REQUIRE(prepare(a, log) == 0);
  const auto m = nlohmann::json::parse(read_whole_file(dir / "sp" / "manifest.json"));
  CHECK(m["separator"] == "<s>");
  CHECK(m["tokenizer"]["vocab_size"] == 1000);
  const auto tok = text::load_tokenizer(a.tokenizer);
  const auto ids = shard_ids(dir / "sp" / "train_000000.bin");
  std::vector<std::int32_t> want{1};
  const auto first = tok->encode(documents().front());
  want.insert(want.end(), first.begin(), first.end());
  want.push_back(1);
  REQUIRE(ids.size() > want.size());
  CHECK(std::vector<std::int32_t>(ids.begin(), ids.begin() + static_cast<long>(want.size())) ==
        want);
}

TEST_CASE("a tokenizer_config.json beside the tokenizer names its BOS and EOS") {
  test::TempDir dir;
  write_file_atomically(
      dir / "tokenizer.json",
      read_whole_file(test::source_dir() / "tests/data/tokenizers/byte_level.json"));
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": {"content": "<|endoftext|>"}, "eos_token": "<|endoftext|>"})";
  CHECK(text::config_token(dir / "tokenizer.json", "bos_token") == "<|endoftext|>");
  CHECK(text::config_token(dir / "tokenizer.json", "eos_token") == "<|endoftext|>");
  CHECK_FALSE(text::config_token(dir / "tokenizer.json", "pad_token").has_value());
  // prepare takes it as the separator without --separator, and an export's
  // config.json gets its id for both.
  {
    std::ofstream(dir / "docs.jsonl") << R"({"text": "the cat"})"
                                      << "\n";
  }
  PrepareArgs a;
  a.tokenizer = dir / "tokenizer.json";
  a.inputs = {(dir / "docs.jsonl").string()};
  a.out = dir / "out";
  std::ostringstream log;
  REQUIRE(prepare(a, log) == 0);
  CHECK(nlohmann::json::parse(read_whole_file(dir / "out" / "manifest.json"))["separator"] ==
        "<|endoftext|>");
  const auto config = nlohmann::json::parse(
      export_config_json(R"({"vocab_size": 2000})", DType::bf16, dir / "tokenizer.json"));
  CHECK(config["bos_token_id"] == 0);
  CHECK(config["eos_token_id"] == 0);
  CHECK(config["torch_dtype"] == "bfloat16");
  const auto small = nlohmann::json::parse(
      export_config_json(R"({"vocab_size": 0})", DType::f32, dir / "tokenizer.json"));
  CHECK(small["bos_token_id"].is_null());  // outside the vocabulary: null
}

namespace {

PrepareArgs byte_level_args(const std::filesystem::path& dir, std::vector<std::string> inputs) {
  PrepareArgs a;
  a.tokenizer = test::source_dir() / "tests/data/tokenizers/byte_level.json";
  a.inputs = std::move(inputs);
  a.separator = "<|endoftext|>";
  a.out = dir / "out";
  return a;
}

bool has_shards(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir)) return false;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".bin" || e.path().filename() == "manifest.json") return true;
  return false;
}

}  // namespace

TEST_CASE(
    "prepare: an empty input is no text, named, and empty documents are skipped and counted") {
  test::TempDir dir;
  std::ofstream(dir / "empty.txt").close();
  std::ofstream(dir / "blank.jsonl") << "{\"text\": \"\"}\n\n";
  std::ostringstream log;
  PrepareArgs a =
      byte_level_args(dir.path(), {(dir / "empty.txt").string(), (dir / "blank.jsonl").string()});
  const std::string msg = test::message_of<DataError>([&] { prepare(a, log); });
  CHECK(msg.find("prepare's inputs hold no text to train on: " + (dir / "empty.txt").string()) ==
        0);
  CHECK(msg.find("(2 empty documents, 0 bytes read)") == std::string::npos);  // 16 bytes of JSON
  CHECK(msg.find("2 empty documents") != std::string::npos);
  CHECK(log.str().find("MB/s") != std::string::npos);
  CHECK(log.str().find("18446744073709") == std::string::npos);  // no negative count wrapped
  CHECK_FALSE(has_shards(dir / "out"));

  std::ofstream(dir / "some.jsonl") << "{\"text\": \"\"}\n{\"text\": \"hello\"}\n";
  a.inputs = {(dir / "empty.txt").string(), (dir / "some.jsonl").string()};
  REQUIRE(prepare(a, log) == 0);
  const auto m = nlohmann::json::parse(read_whole_file(dir / "out" / "manifest.json"));
  CHECK(m["train"]["documents"] == 1);
  CHECK(log.str().find("prepare: skipped 2 empty documents") != std::string::npos);
}

TEST_CASE("prepare: bytes that are not UTF-8 are refused naming file and offset, or replaced") {
  test::TempDir dir;
  std::ofstream(dir / "latin1.txt", std::ios::binary) << "caf\xE9 au lait";
  std::ofstream(dir / "lines.jsonl", std::ios::binary)
      << "{\"text\": \"fine\"}\n{\"text\": \"bad \xFF\"}\n";
  std::ostringstream log;
  PrepareArgs a = byte_level_args(dir.path(), {(dir / "latin1.txt").string()});
  std::string msg = test::message_of<DataError>([&] { prepare(a, log); });
  CHECK(msg.find((dir / "latin1.txt").string() + ": byte 3 of the file (0xE9) is not UTF-8") == 0);
  CHECK(msg.find("--replace-invalid-utf8") != std::string::npos);
  a.inputs = {(dir / "lines.jsonl").string()};
  msg = test::message_of<DataError>([&] { prepare(a, log); });
  CHECK(msg.find((dir / "lines.jsonl").string() + ":2: byte 31 of the file (0xFF)") == 0);
  CHECK_FALSE(has_shards(dir / "out"));

  a.inputs = {(dir / "latin1.txt").string()};
  a.replace_invalid_utf8 = true;
  REQUIRE(prepare(a, log) == 0);
  CHECK(log.str().find("replaced 1 invalid UTF-8 sequence(s) with U+FFFD") != std::string::npos);
  const auto tok = text::load_tokenizer(a.tokenizer);
  auto want = tok->encode("caf\xEF\xBF\xBD au lait");
  want.insert(want.begin(), 0);
  CHECK(shard_ids(dir / "out" / "train_000000.bin") == want);
}

TEST_CASE(
    "prepare: a validation split that takes every document is refused and the rerun starts clean") {
  test::TempDir dir;
  std::ofstream(dir / "one.txt") << "one document of a few words";
  std::ostringstream log;
  PrepareArgs a = byte_level_args(dir.path(), {(dir / "one.txt").string()});
  a.val_tokens = 2000;
  const std::string msg = test::message_of<DataError>([&] { prepare(a, log); });
  CHECK(msg.find("--val-tokens 2000 took every document (1, ") == 0);
  CHECK_FALSE(has_shards(dir / "out"));  // val_000000.bin was written, then removed
  a.val_tokens = 0;
  REQUIRE(prepare(a, log) == 0);  // not "an earlier prepare"
  const auto m = nlohmann::json::parse(read_whole_file(dir / "out" / "manifest.json"));
  CHECK(m["tokenizer"]["identity"] == text::tokenizer_identity(a.tokenizer));
}
