// Tokenizers from Hugging Face tokenizer.json files against the ids
// `tokenizers` itself gives (tests/data/tokenizers: four small tokenizers
// trained with it, one per shape ztrain reads, and golden.json, written by
// tools/make_tokenizer_golden.py): every id of every case, and the decoded text. And
// SentencePiece models (sp_bpe.model, sp_unigram.model) against the
// Python package's ids.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "support.h"
#include "text/hf_tokenizer.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

using namespace ztrain;

namespace {

nlohmann::json golden() {
  std::ifstream in(test::source_dir() / "tests/data/tokenizers/golden.json");
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

// NAME.json (a tokenizer.json), or NAME.model (a SentencePiece model).
std::filesystem::path tokenizer_file(const std::string& name) {
  const auto dir = test::source_dir() / "tests/data/tokenizers";
  return std::filesystem::exists(dir / (name + ".json")) ? dir / (name + ".json")
                                                         : dir / (name + ".model");
}

}  // namespace

TEST_CASE("tokenizers: every id of every case is Hugging Face's, and decodes to its text") {
  const auto g = golden();
  std::size_t compared = 0;
  for (const auto& [name, cases] : g.at("tokenizers_cases").items()) {
    CAPTURE(name);
    const auto tok = text::load_tokenizer(tokenizer_file(name));
    for (const auto& c : cases) {
      const std::string input = c.at("text");
      CAPTURE(input);
      const auto want = c.at("ids").get<std::vector<std::int32_t>>();
      const auto got = tok->encode(input);
      CHECK(got == want);
      CHECK(tok->decode(want) == c.at("decoded").get<std::string>());
      compared += want.size();
    }
  }
  CHECK(compared > 5000);
  CHECK(g.at("tokenizers_cases").contains("sp_bpe"));
  CHECK(g.at("tokenizers_cases").contains("sp_unigram"));
}

// Added tokens that overlap (<|end|>, <|end_of_turn|>, <|end_of beside
// <|end_of_text|>): the longest wins at each position, as in tokenizers.
// golden_added.json holds the added_tokens entries tokenizers saved and its
// ids; they go into the committed split_regex.json here.
TEST_CASE("tokenizers: overlapping added tokens match as Hugging Face's, longest first") {
  const auto dir = test::source_dir() / "tests/data/tokenizers";
  const auto g = nlohmann::json::parse(std::ifstream(dir / "golden_added.json"));
  auto j = nlohmann::json::parse(std::ifstream(dir / g.at("base").get<std::string>()));
  for (const auto& added : g.at("added_tokens")) j.at("added_tokens").push_back(added);
  test::TempDir tmp;
  std::ofstream(tmp / "tokenizer.json") << j.dump();
  const auto tok = text::load_tokenizer(tmp / "tokenizer.json");
  const auto& cases = g.at("tokenizers_cases").at("added_overlap");
  REQUIRE(cases.size() >= 5);
  for (const auto& c : cases) {
    const std::string input = c.at("text");
    CAPTURE(input);
    const auto want = c.at("ids").get<std::vector<std::int32_t>>();
    CHECK(tok->encode(input) == want);
    CHECK(tok->decode(want) == c.at("decoded").get<std::string>());
  }
}

namespace {

// A golden_parts.json variant's tokenizer.json: its base with the edit
// tools/make_tokenizer_golden.py made (top-level parts replaced, model flags set, or the
// merges written as "a b" strings).
nlohmann::json edited(const nlohmann::json& variant) {
  auto j = nlohmann::json::parse(std::ifstream(test::source_dir() / "tests/data/tokenizers" /
                                               variant.at("base").get<std::string>()));
  for (const auto& [key, value] : variant.at("edit").items()) {
    if (key == "model") {
      j["model"].update(value);
    } else if (key == "merges") {
      for (auto& m : j["model"]["merges"])
        m = m[0].get<std::string>() + " " + m[1].get<std::string>();
    } else {
      j[key] = value;
    }
  }
  return j;
}

std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return bytes;
}

nlohmann::json golden_parts() {
  return nlohmann::json::parse(
      std::ifstream(test::source_dir() / "tests/data/tokenizers/golden_parts.json"));
}

}  // namespace

// Each part of tokenizer.json the five tokenizers above leave out, set on
// one of them (golden_parts.json, make_tokenizer_golden.py --parts-only): the ids, the
// decoded text, and the ids with the post-processor's special tokens, which
// must be the start token ztrain puts before each document and nothing
// else. The invalid UTF-8 cases are bytes: ztrain's lossy decoding
// (prepare --replace-invalid-utf8) must give the text tokenizers encoded.
TEST_CASE("tokenizers: every part variant gives Hugging Face's ids, start token and text") {
  test::TempDir dir;
  const auto parts = golden_parts();
  std::size_t compared = 0, raw = 0, started = 0;
  for (const auto& variant : parts.at("variants")) {
    const std::string name = variant.at("name");
    CAPTURE(name);
    std::ofstream(dir / (name + ".json")) << edited(variant).dump();
    const auto tok = text::load_tokenizer(dir / (name + ".json"));
    std::vector<std::int32_t> start;
    if (const auto bos = tok->bos_token()) start = {*tok->token_id(*bos)};
    for (const auto& c : variant.at("cases")) {
      std::string input = c.at("text");
      if (c.contains("bytes")) {
        CHECK(text::lossy_utf8(from_hex(c.at("bytes"))) == input);
        ++raw;
      }
      CAPTURE(input);
      const auto want = c.at("ids").get<std::vector<std::int32_t>>();
      CHECK(tok->encode(input) == want);
      if (c.contains("decoded")) CHECK(tok->decode(want) == c.at("decoded").get<std::string>());
      auto with_start = start;
      with_start.insert(with_start.end(), want.begin(), want.end());
      CHECK(with_start == c.at("with_special").get<std::vector<std::int32_t>>());
      started += !start.empty();
      compared += want.size();
    }
  }
  CHECK(compared > 15000);
  CHECK(raw >= 8 * 20);
  CHECK(started >= 2 * 49);
}

// The parts the golden tokenizers use, together, are every part the reader
// takes: a part added to the reader without a golden case fails here.
TEST_CASE("tokenizers: every part ztrain reads in tokenizer.json has a golden case") {
  test::TempDir dir;
  std::set<std::string> covered;
  const auto cover = [&](const std::filesystem::path& file) {
    for (const auto& part : text::tokenizer_json_parts_used(file)) covered.insert(part);
  };
  const auto g = golden(), parts = golden_parts();
  for (const auto& [name, cases] : g.at("tokenizers_cases").items())
    if (tokenizer_file(name).extension() == ".json") cover(tokenizer_file(name));
  for (const auto& variant : parts.at("variants")) {
    const std::string name = variant.at("name");
    std::ofstream(dir / (name + ".json")) << edited(variant).dump();
    cover(dir / (name + ".json"));
  }
  const auto all = text::tokenizer_json_parts();
  for (const auto& part : all) {
    CAPTURE(part);
    CHECK(covered.count(part) == 1);
  }
  CHECK(covered.size() == all.size());
}

TEST_CASE("tokenizers: vocabulary size and the ids of named tokens") {
  const auto gpt = text::load_tokenizer(tokenizer_file("byte_level"));
  CHECK(gpt->vocab_size() == 2000);
  CHECK(gpt->token_id("<|endoftext|>") == 0);
  const auto sp = text::load_tokenizer(tokenizer_file("sentencepiece"));
  CHECK(sp->token_id("<s>") == 1);
  CHECK(sp->token_id("<0x41>") == 3 + 0x41);
  CHECK_FALSE(sp->token_id("no such token").has_value());
  const auto model = text::load_tokenizer(tokenizer_file("sp_bpe"));
  CHECK(model->vocab_size() == 1000);
  CHECK(model->bos_token() == "<s>");
  CHECK(model->token_id("<s>") == 1);
  CHECK_FALSE(model->token_id("no such piece").has_value());
}

TEST_CASE("tokenizers: what is not built is refused naming its JSON key") {
  test::TempDir dir;
  const auto base = nlohmann::json::parse(std::ifstream(tokenizer_file("sentencepiece")));
  const auto refused = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = base;
    edit(j);
    std::ofstream(dir / "t.json") << j.dump();
    return test::message_of<ConfigError>([&] { text::load_tokenizer(dir / "t.json"); });
  };
  CHECK(refused([](auto& j) {
          j["normalizer"]["normalizers"][1] = {{"type", "NFC"}};
        }).find("t.json: normalizer.normalizers[1].type is \"NFC\"") != std::string::npos);
  CHECK(refused([](auto& j) {
          j["model"]["type"] = "Unigram";
        }).find("model.type is \"Unigram\"") != std::string::npos);
  CHECK(refused([](auto& j) { j["model"]["dropout"] = 0.1; }).find("model.dropout is 0.1") !=
        std::string::npos);
  CHECK(refused([](auto& j) {
          j["added_tokens"][1]["lstrip"] = true;
        }).find("added_tokens[1].lstrip is true") != std::string::npos);
  CHECK(refused([](auto& j) {
          j["truncation"] = {{"max_length", 512}};
        }).find("truncation is") != std::string::npos);
  CHECK(refused([](auto& j) {
          j["pre_tokenizer"] = {
              {"type", "Split"}, {"pattern", {{"Regex", "(["}}}, {"behavior", "Isolated"}};
        }).find("pre_tokenizer.pattern: the pattern /([/ does not compile") != std::string::npos);
  CHECK(refused([](auto& j) {
          j["model"]["merges"][0] = "a b c";
        }).find("model.merges[0] is \"a b c\"") != std::string::npos);
  // Found by fuzz_tokenizer: a step without a type.
  CHECK(refused([](auto& j) {
          j["normalizer"]["normalizers"][1].erase("type");
        }).find("normalizer.normalizers[1].type is missing: ztrain reads the normalizers") !=
        std::string::npos);
  CHECK(refused([](auto& j) {
          j["pre_tokenizer"] = {{"replacement", "x"}};
        }).find("pre_tokenizer.type is missing") != std::string::npos);
  CHECK(refused([](auto& j) {
          j["normalizer"]["normalizers"][1].erase("pattern");
        }).find("normalizer.normalizers[1].pattern is missing") != std::string::npos);
}

// What the reader would read but no golden case checks, and post-processors
// whose documents ztrain would not build as the file describes.
TEST_CASE(
    "tokenizers: parts without a golden case and templates ztrain cannot follow are refused") {
  test::TempDir dir;
  const auto refused = [&](const char* base, const std::function<void(nlohmann::json&)>& edit) {
    auto j = nlohmann::json::parse(std::ifstream(tokenizer_file(base)));
    edit(j);
    std::ofstream(dir / "t.json") << j.dump();
    return test::message_of<ConfigError>([&] { text::load_tokenizer(dir / "t.json"); });
  };
  const auto template_of = [](const nlohmann::json& single) {
    return nlohmann::json{{"type", "TemplateProcessing"},
                          {"single", single},
                          {"special_tokens",
                           {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}},
                            {"</s>", {{"id", "</s>"}, {"ids", {2}}, {"tokens", {"</s>"}}}}}}};
  };
  const nlohmann::json s = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  const nlohmann::json e = {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}};
  const nlohmann::json a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  CHECK(refused("sentencepiece", [&](auto& j) {
          j["post_processor"] = template_of({s, a, e});
        }).find("t.json: post_processor.single is [") != std::string::npos);
  CHECK(refused("sentencepiece", [&](auto& j) {
          j["post_processor"] = template_of({a, e});
        }).find("the template must be \"$A\" or \"<s> $A\"") != std::string::npos);
  CHECK(refused("sentencepiece",
                [&](auto& j) {
                  j["post_processor"] = {{"type", "RobertaProcessing"}};
                })
            .find("post_processor.type is \"RobertaProcessing\": ztrain reads the "
                  "post-processors") != std::string::npos);
  CHECK(refused("sentencepiece", [&](auto& j) {
          j["post_processor"] = template_of({s, a});
          j["post_processor"]["special_tokens"]["<s>"]["ids"] = {2};
        }).find("inserts [2], not its vocabulary id [1]") != std::string::npos);
  CHECK(refused("sentencepiece", [&](auto& j) {
          j["post_processor"] = {{"type", "Sequence"},
                                 {"processors", {template_of({s, a}), template_of({s, a})}}};
        }).find("two templates each start the text") != std::string::npos);
  // tokenizers 0.23.3: "add_prefix_space does not match declared prepend_scheme".
  CHECK(refused("metaspace",
                [](auto& j) {
                  j["pre_tokenizer"].erase("prepend_scheme");
                  j["pre_tokenizer"]["add_prefix_space"] = false;
                })
            .find("pre_tokenizer.add_prefix_space is false: it contradicts prepend_scheme "
                  "\"always\"") != std::string::npos);
  CHECK(refused("metaspace", [](auto& j) {
          j["pre_tokenizer"].erase("replacement");
        }).find("pre_tokenizer.replacement is missing") != std::string::npos);
  // Read the same way as the pre-tokenizer's, but held to no golden case.
  CHECK(refused("metaspace",
                [](auto& j) {
                  auto& m = j["decoder"]["decoders"][2];
                  m["prepend_scheme"] = "never";
                  m["add_prefix_space"] = false;
                })
            .find("t.json: decoder.decoders[2]: Metaspace add_prefix_space=false has no case "
                  "checked against the tokenizers package") != std::string::npos);
}

// BPE and Unigram SentencePiece models have golden cases (sp_bpe,
// sp_unigram); a char or word model has none and is refused.
TEST_CASE("sentencepiece: a model kind without golden cases is refused, naming it") {
  const std::string msg =
      test::message_of<ConfigError>([] { text::load_tokenizer(tokenizer_file("sp_char")); });
  CHECK(msg.find("sp_char.model' is of model_type CHAR: ztrain reads BPE and Unigram models") !=
        std::string::npos);
}

TEST_CASE("tokenizers: what the tokenizers package refuses is refused, naming the key") {
  // Each as tokenizers 0.23.3 refuses it: "Missing vocab/merges" (merges
  // absent; an empty list it takes), "missing field `content`", "missing
  // field `id`", "Token `zzzq` out of vocabulary".
  test::TempDir dir;
  const auto base = nlohmann::json::parse(std::ifstream(tokenizer_file("sentencepiece")));
  const auto load = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = base;
    edit(j);
    std::ofstream(dir / "t.json") << j.dump();
    text::load_tokenizer(dir / "t.json");
  };
  const auto refused = [&](const std::function<void(nlohmann::json&)>& edit) {
    return test::message_of<ConfigError>([&] { load(edit); });
  };
  CHECK(refused([](auto& j) {
          j["model"].erase("merges");
        }).find("t.json: model.merges is missing") != std::string::npos);
  CHECK(refused([](auto& j) {
          j["model"]["merges"] = nullptr;
        }).find("t.json: model.merges is missing") != std::string::npos);
  CHECK(refused([](auto& j) { j["model"].erase("vocab"); }).find("model.vocab is missing") !=
        std::string::npos);
  CHECK(refused([](auto& j) {
          j["added_tokens"][0].erase("content");
        }).find("added_tokens[0].content is missing") != std::string::npos);
  CHECK(refused([](auto& j) {
          j["added_tokens"][0].erase("id");
        }).find("added_tokens[0].id is missing") != std::string::npos);
  CHECK(refused([](auto& j) {
          j["model"]["merges"].insert(j["model"]["merges"].begin(),
                                      nlohmann::json::array({"zzzq", "qqqz"}));
        }).find("names a token the vocabulary lacks") != std::string::npos);
  // What it takes, ztrain takes: no merges at all (characters only), no
  // model type (BPE).
  load([](auto& j) { j["model"]["merges"] = nlohmann::json::array(); });
  load([](auto& j) { j["model"].erase("type"); });
}

TEST_CASE("tokenizers: the identity is the tokenizer's, however its file is formatted") {
  test::TempDir dir;
  const auto base = nlohmann::json::parse(std::ifstream(tokenizer_file("sentencepiece")));
  std::ofstream(dir / "compact.json") << base.dump();
  std::ofstream(dir / "pretty.json") << base.dump(2);
  auto other = base;
  other["model"]["merges"].erase(other["model"]["merges"].begin());
  std::ofstream(dir / "other.json") << other.dump();
  const std::string id = text::tokenizer_identity(dir / "compact.json");
  CHECK(id.size() == 16);
  CHECK(text::tokenizer_identity(dir / "pretty.json") == id);
  CHECK(text::tokenizer_identity(dir / "other.json") != id);
}

TEST_CASE("utf-8: invalid bytes decode as Rust's from_utf8_lossy does") {
  CHECK(text::lossy_utf8("a\xC3(b") == "a\xEF\xBF\xBD(b");
  CHECK(text::lossy_utf8("\xE2\x82") == "\xEF\xBF\xBD");  // a truncated 3-byte sequence: one
  CHECK(text::lossy_utf8("\xED\xA0\x80") ==
        "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate: three
  CHECK(text::lossy_utf8("\xF0\x9F\x9A\x80") == "\xF0\x9F\x9A\x80");
  CHECK_FALSE(text::first_invalid_utf8("plain \xF0\x9F\x9A\x80 text"));
  CHECK(text::first_invalid_utf8("ab\xC3(") == 2u);
  CHECK(text::first_invalid_utf8("ok\xED\xA0\x80") == 2u);  // a surrogate
  CHECK(text::first_invalid_utf8("\xE2\x82") == 0u);        // cut short
  for (int b = 0; b < 256; ++b)
    CHECK(text::char_byte(text::byte_char(static_cast<std::uint8_t>(b))) == b);
}
