// Weights in and out: safetensors round trips, Hugging Face names and the
// Conv1D layout, and clear errors for every malformed or mismatched file.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/weights.h"
#include "checkpoint/weights_import.h"
#include "io/safetensors.h"
#include "io/safetensors_set.h"
#include "support.h"

using namespace ztrain;

namespace {

std::string tiny(const std::string& arch, int seed, const std::string& extra = "") {
  return "[model]\narch = \"" + arch +
         "\"\nn_layer = 2\nn_head = 2\nn_embd = 8\nvocab_size = 11\n"
         "seq_len = 5\n" +
         extra + "[train]\nseed = " + std::to_string(seed) + "\nmicro_batch_size = 1\n";
}

IdVector<ParamId, std::vector<float>> values(Run& run) {
  IdVector<ParamId, std::vector<float>> out;
  const auto params = run.model->params();
  for (ParamId p : params.ids()) {
    out.emplace_back(static_cast<std::size_t>(params[p].shape.numel()));
    run.strategy->read_param(p, out.back().data());
  }
  return out;
}

void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

bool contains(const std::string& s, const std::string& part) {
  INFO("message: " << s);
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("export then import round-trips exactly, both architectures, file and directory") {
  for (const char* arch : {"gpt2", "llama"}) {
    test::TempDir dir;
    Run a = test::make_run(tiny(arch, 1));
    export_weights(*a.model, *a.strategy, dir / "w.safetensors", DType::f32);
    export_weights(*a.model, *a.strategy, dir / "hf", DType::f32);
    CHECK(std::filesystem::exists(dir / "hf" / "model.safetensors"));
    std::ifstream cfg(dir / "hf" / "config.json");
    const std::string text((std::istreambuf_iterator<char>(cfg)), {});
    CHECK(contains(text, std::string("\"model_type\": \"") + arch + "\""));
    for (const auto& source : {dir / "w.safetensors", dir / "hf"}) {
      Run b = test::make_run(tiny(arch, 2, "init_from = \"" + source.string() + "\"\n"));
      CHECK(values(b) == values(a));
      Run c = test::make_run(tiny(arch, 2));
      CHECK(values(c) != values(a));
    }
  }
}

TEST_CASE("bf16 and fp16 exports hold the rounded values") {
  test::TempDir dir;
  Run a = test::make_run(tiny("llama", 1));
  const auto full = values(a);
  for (DType t : {DType::bf16, DType::f16}) {
    export_weights(*a.model, *a.strategy, dir / "w.safetensors", t);
    const SafetensorsReader r(dir / "w.safetensors");
    CHECK(r.entries().front().dtype == t);
    Run b = test::make_run(
        tiny("llama", 2, "init_from = \"" + (dir / "w.safetensors").string() + "\"\n"));
    const auto got = values(b);
    for (ParamId p : full.ids())
      for (std::size_t i = 0; i < full[p].size(); ++i) {
        std::uint16_t h;
        convert(&full[p][i], DType::f32, &h, t, 1);
        float back;
        convert(&h, t, &back, DType::f32, 1);
        CHECK(got[p][i] == back);
      }
  }
}

TEST_CASE(
    "a hand-written Hugging Face GPT-2 file with Conv1D weights loads to the expected tensors") {
  // GPT2Model names (no "transformer." prefix), c_attn etc. stored (in, out),
  // plus buffers and a tied lm_head copy that import must skip.
  Run ref = test::make_run(tiny("gpt2", 1));
  const auto params = ref.model->params();
  test::TempDir dir;
  IdVector<ParamId, std::vector<float>> storage;
  std::vector<SafetensorsTensor> tensors;
  for (const auto& p : params) {
    const std::int64_t n = p.shape.numel();
    storage.emplace_back(static_cast<std::size_t>(n));
    auto& v = storage.back();
    for (std::int64_t i = 0; i < n; ++i)
      v[static_cast<std::size_t>(i)] =
          static_cast<float>(i % 97) * 0.01f + static_cast<float>(storage.size());
    const Shape shape = p.hf_transposed ? Shape{p.shape[1], p.shape[0]} : p.shape;
    tensors.push_back({p.name, DType::f32, shape, v.data()});
  }
  const std::vector<float> mask(25, 1.0f);
  tensors.push_back({"h.0.attn.bias", DType::f32, {1, 1, 5, 5}, mask.data()});
  using namespace id_literals;
  tensors.push_back({"lm_head.weight", DType::f32, params[0_param].shape, storage[0_param].data()});
  write_safetensors(dir / "hf.safetensors", tensors, {{"format", "pt"}});

  Run b = test::make_run(
      tiny("gpt2", 2, "init_from = \"" + (dir / "hf.safetensors").string() + "\"\n"));
  const auto got = values(b);
  for (ParamId p : params.ids()) {
    const auto& spec = params[p];
    INFO(spec.name);
    if (!spec.hf_transposed) {
      CHECK(got[p] == storage[p]);
      continue;
    }
    const std::int64_t rows = spec.shape[0], cols = spec.shape[1];  // ours: (out, in)
    CHECK(spec.name.find("c_") != std::string::npos);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c)
        CHECK(got[p][static_cast<std::size_t>(r * cols + c)] ==
              storage[p][static_cast<std::size_t>(c * rows + r)]);
  }
}

TEST_CASE("names, shapes and extra tensors that do not match are listed together") {
  Run gpt = test::make_run(tiny("gpt2", 1));
  test::TempDir dir;
  export_weights(*gpt.model, *gpt.strategy, dir / "gpt2.safetensors", DType::f32);
  const std::string msg = test::message_of<DataError>([&] {
    test::make_run(
        tiny("llama", 1, "init_from = \"" + (dir / "gpt2.safetensors").string() + "\"\n"));
  });
  CHECK(contains(msg, "does not match the llama model"));
  CHECK(contains(msg, "missing from the file:\n    model.embed_tokens.weight (11, 8)"));
  CHECK(contains(msg, "28 unexpected in the file:\n    transformer.h.0.attn.c_attn.bias (24)"));
  CHECK(contains(msg, "... and 20 more"));
  const std::string shape_msg = test::message_of<DataError>([&] {
    test::make_run(
        "[model]\narch = \"gpt2\"\nn_layer = 2\nn_head = 2\nn_embd = 8\nvocab_size = 12\n"
        "seq_len = 5\ninit_from = \"" +
        (dir / "gpt2.safetensors").string() + "\"\n");
  });
  CHECK(contains(shape_msg, "transformer.wte.weight: shape (11, 8) in the file, (12, 8) expected"));
}

TEST_CASE("malformed and truncated safetensors files are clear errors") {
  test::TempDir dir;
  const auto f = dir / "bad.safetensors";
  auto error_of = [&](const std::string& bytes) {
    write_bytes(f, bytes);
    return test::message_of<DataError>([&] { SafetensorsReader r(f); });
  };
  CHECK(contains(error_of("abc"), "shorter than the 8-byte header length"));
  CHECK(contains(error_of(safetensors_bytes("{}", "").substr(0, 8) + "{"),
                 "the header claims 2 bytes"));
  CHECK(contains(error_of(safetensors_bytes("{\"a\": ", "")), "not valid JSON"));
  CHECK(contains(
      error_of(safetensors_bytes(R"({"a": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})",
                                 std::string(8, '\0'))),
      "dtype F64 is not supported"));
  CHECK(contains(
      error_of(safetensors_bytes(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
                                 std::string(8, '\0'))),
      "shape (3) of F32 needs 12 bytes but data_offsets span 8"));
  CHECK(contains(error_of(safetensors_bytes(
                     R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
                     std::string(8, '\0'))),
                 "lie outside the 8 data bytes"));
  CHECK(contains(
      error_of(safetensors_bytes(
          R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
          std::string(8, '\0'))),
      "overlap"));
  CHECK(contains(error_of(safetensors_bytes(
                     R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})",
                     std::string(4, '\0'))),
                 "non-integer dimension"));
  const SafetensorsReader ok([&] {
    write_bytes(
        f,
        safetensors_bytes(
            R"({"__metadata__": {"format": "pt"}, "a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}})",
            std::string("\x80\x3f\x00\x40", 4)));
    return f;
  }());
  CHECK(ok.metadata().at("format") == "pt");
  float v[2];
  ok.read_f32(*ok.find("a"), v);
  CHECK(v[0] == 1.0f);
  CHECK(v[1] == 2.0f);
}

TEST_CASE("exporting a run directory converts its weights and copies config.json") {
  test::TempDir dir;
  Run a = test::make_run(tiny("llama", 1));
  export_weights(*a.model, *a.strategy, dir / "run", DType::f32);
  convert_weights(dir / "run", dir / "out", DType::bf16);
  CHECK(std::filesystem::exists(dir / "out" / "config.json"));
  const SafetensorsReader r(dir / "out" / "model.safetensors");
  CHECK(r.entries().size() == a.model->params().size());
  CHECK(r.entries().front().dtype == DType::bf16);
  CHECK(r.metadata().at("format") == "pt");
  CHECK(contains(test::message_of<DataError>(
                     [&] { convert_weights(dir / "nothing", dir / "o2", DType::f32); }),
                 "no weights at"));
}

TEST_CASE("any element range of a parameter reads as that part of the whole, Conv1D included") {
  test::TempDir dir;
  Run a = test::make_run(tiny("gpt2", 3));
  export_weights(*a.model, *a.strategy, dir / "w.safetensors", DType::f32);
  const SafetensorsSet reader(dir / "w.safetensors");
  WeightsFile file(reader, *a.model);
  const auto whole = values(a);
  const auto params = a.model->params();
  bool transposed = false;
  for (ParamId p : params.ids()) {
    const std::uint64_t n = whole[p].size();
    transposed = transposed || params[p].hf_transposed;
    // Ranges starting and ending inside rows, whole rows, single elements.
    for (const std::uint64_t first : {std::uint64_t{0}, std::uint64_t{1}, n / 3, n - 1})
      for (const std::uint64_t count : {std::uint64_t{1}, std::uint64_t{7}, n / 2, n}) {
        if (first + count > n) continue;
        INFO(params[p].name << " [" << first << ", +" << count << ")");
        std::vector<float> got(count, -1.0f);
        file.get(p, first, count, StateArray::master, got.data());
        CHECK(std::equal(got.begin(), got.end(), whole[p].begin() + static_cast<long>(first)));
        file.get(p, first, count, StateArray::m, got.data());
        CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 0.0f; }));
      }
  }
  CHECK(transposed);  // the Conv1D layout was exercised
  // A whole read of every parameter reads every byte of the model once.
  WeightsFile once(reader, *a.model);
  std::vector<float> buf;
  for (ParamId p : params.ids()) {
    buf.resize(whole[p].size());
    once.get(p, 0, buf.size(), StateArray::master, buf.data());
  }
  CHECK(once.bytes_read() == once.file_bytes());
}

TEST_CASE("sharded weights: a model.safetensors.index.json's shards are the model, checked first") {
  test::TempDir dir;
  Run a = test::make_run(tiny("llama", 3));
  export_weights(*a.model, *a.strategy, dir / "whole.safetensors", DType::f32);
  const SafetensorsReader whole(dir / "whole.safetensors");
  // Two shards, the tensors alternating between them, as transformers
  // splits a large model.
  const std::filesystem::path sharded = dir / "sharded";
  std::filesystem::create_directories(sharded);
  std::vector<std::vector<float>> data;
  std::vector<SafetensorsTensor> parts[2];
  nlohmann::json map = nlohmann::json::object();
  std::size_t i = 0;
  for (const SafetensorsEntry& e : whole.entries()) {
    data.emplace_back(static_cast<std::size_t>(e.shape.numel()));
    whole.read_f32(e, data.back().data());
    const std::string shard =
        i % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    parts[i % 2].push_back({e.name, DType::f32, e.shape, data.back().data()});
    map[e.name] = shard;
    ++i;
  }
  write_safetensors(sharded / "model-00001-of-00002.safetensors", parts[0], {{"format", "pt"}});
  write_safetensors(sharded / "model-00002-of-00002.safetensors", parts[1], {{"format", "pt"}});
  std::ofstream(sharded / "model.safetensors.index.json")
      << nlohmann::json{{"weight_map", map}}.dump();
  const SafetensorsSet set(sharded);
  CHECK(set.files().size() == 2);
  Run b = test::make_run(tiny("llama", 4, "init_from = \"" + sharded.string() + "\"\n"));
  const auto want = values(a), got = values(b);
  for (ParamId p : a.model->params().ids()) CHECK(got[p] == want[p]);
  // What the index says must be what the shards hold.
  const auto refused = [&](const nlohmann::json& m) {
    std::ofstream(sharded / "model.safetensors.index.json")
        << nlohmann::json{{"weight_map", m}}.dump();
    return test::message_of<DataError>([&] { SafetensorsSet s(sharded); });
  };
  auto bad = map;
  bad[map.begin().key()] = "model-00009-of-00002.safetensors";
  CHECK(contains(refused(bad),
                 "names the shard 'model-00009-of-00002.safetensors', which is not there"));
  bad = map;
  bad[map.begin().key()] = "model-00002-of-00002.safetensors";
  CHECK(contains(refused(bad), "in 'model-00002-of-00002.safetensors', which lacks it"));
  auto doubled = parts[1];
  doubled.push_back(parts[0].front());  // shard 1's first tensor, in shard 2 as well
  write_safetensors(sharded / "model-00002-of-00002.safetensors", doubled, {{"format", "pt"}});
  CHECK(contains(refused(map), "'" + parts[0].front().name + "' is in both"));
}
