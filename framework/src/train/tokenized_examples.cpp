#include "train/tokenized_examples.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "io/crc32c.h"
#include "io/durable_file.h"
#include "text/tokenizer.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr const char* kFormat = "ztrain tokenized examples 1";
constexpr const char* kManifest = "tokenized.json";

// The keys that shape the examples, as the run file names them. The seed
// is left out: it only draws dataset_info.json's num_samples, which a
// load keeps as saved (as LLaMA-Factory's does).
json shaping_keys(const SftRequest& r) {
  return {{"dataset", r.datasets},
          {"template", r.chat_template},
          {"cutoff_len", r.cutoff_len},
          {"train_on_prompt", r.train_on_prompt},
          {"mask_history", r.mask_history},
          {"max_samples", r.max_samples},
          {"enable_thinking", r.enable_thinking},
          {"default_system", r.default_system ? json(*r.default_system) : json()},
          {"stage", r.pretrain.on ? "pt" : "sft"},
          {"packing", r.pretrain.on && r.pretrain.packing},  // pt's; sft packs rows, not examples
          {"preprocessing_num_workers", r.pretrain.on ? r.pretrain.workers : 1},
          {"preprocessing_batch_size", r.pretrain.on ? r.pretrain.batch : 1000}};
}

// A file's size and CRC-32C, as read now.
json file_identity(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return nullptr;
  std::uint32_t crc = 0;
  std::uint64_t bytes = 0;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    crc = crc32c(buf.data(), n, crc);
    bytes += n;
  }
  return {{"bytes", bytes}, {"crc32c", crc}};
}

// Every file the examples came from: what the reader read, the template
// file, and the model directory's tokenizer_config.json (its template and
// special tokens).
std::vector<std::string> sources(const SftRequest& r, const SftExamples& e) {
  std::vector<std::string> files;
  for (const std::string& f : e.files) files.push_back(fs::absolute(f).lexically_normal().string());
  if (!e.chat_template_file.empty())
    files.push_back(fs::absolute(e.chat_template_file).lexically_normal().string());
  const fs::path config = fs::path(r.model_dir) / "tokenizer_config.json";
  if (fs::exists(config)) files.push_back(fs::absolute(config).lexically_normal().string());
  return files;
}

void write_ints(const fs::path& path, const std::vector<std::int32_t>& v) {
  DurableFile f(path);
  f.write(v.data(), v.size() * sizeof(std::int32_t));
  f.finish();
}

std::vector<std::int32_t> read_ints(const fs::path& path, std::size_t n) {
  std::vector<std::int32_t> v(n);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(v[0])));
  if (!in || in.peek() != std::char_traits<char>::eof())
    throw DataError(path.string() + ": not the " + std::to_string(n) +
                    " ids tokenized.json records; remove the directory to encode the datasets "
                    "again");
  return v;
}

void save(const fs::path& dir, const SftRequest& r, const SftExamples& e) {
  json files = json::array();
  for (const std::string& f : sources(r, e))
    files.push_back({{"path", f}, {"file", file_identity(f)}});
  const json manifest = {{"format", kFormat},
                         {"keys", shaping_keys(r)},
                         {"tokenizer_identity", e.tokenizer_identity},
                         {"files", files},
                         {"tokens", e.input_ids.size()},
                         {"starts", e.starts},
                         {"where", e.where},
                         {"bad_rows", e.bad_rows},
                         {"bad", e.bad},
                         {"read", e.files},
                         {"tokenizer", e.tokenizer},
                         {"chat_template", e.chat_template},
                         {"chat_template_file", e.chat_template_file},
                         {"chat_template_text", e.chat_template_text}};
  // Whole or absent: written beside, renamed into place; a rank that
  // finds another's save there first keeps it (the same examples).
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
  std::error_code made;
  fs::remove_all(tmp, made);
  fs::create_directories(tmp, made);
  if (made)
    throw DataError(tmp.string() + ": cannot be made (" + made.message() +
                    "); give [data] tokenized_path a directory that can be written");
  write_ints(tmp / "input_ids.bin", e.input_ids);
  write_ints(tmp / "labels.bin", e.labels);
  write_file_atomically(tmp / kManifest, manifest.dump(1) + "\n");
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec) {
    fs::remove_all(tmp);
    if (!fs::exists(dir / kManifest))
      throw DataError(dir.string() + ": the tokenized examples cannot be saved there: " +
                      ec.message() + "; give [data] tokenized_path a writable directory");
  }
}

// The first way the saved examples differ from what this run would read.
std::string difference(const json& m, const SftRequest& r, const std::string& tokenizer_identity) {
  const json now = shaping_keys(r);
  for (const auto& [key, value] : now.items())
    if (!m.at("keys").contains(key) || m.at("keys").at(key) != value)
      return "[data] " + key + " was " + m.at("keys").value(key, json()).dump() +
             " when they were saved, and is " + value.dump() + " now";
  if (m.at("tokenizer_identity") != tokenizer_identity)
    return "the model directory's tokenizer is not the one they were encoded with";
  for (const json& f : m.at("files"))
    if (file_identity(f.at("path").get<std::string>()) != f.at("file"))
      return f.at("path").get<std::string>() + " has changed (or is gone) since";
  return {};
}

SftExamples load(const fs::path& dir, const SftRequest& r) {
  const json m = json::parse(read_whole_file(dir / kManifest), nullptr, false);
  if (!m.is_object() || m.value("format", "") != kFormat)
    throw ConfigError(dir.string() + "/" + kManifest + " is not ztrain's (format \"" + kFormat +
                      "\"); remove the directory to encode the datasets again");
  const fs::path tokenizer = text::tokenizer_in(r.model_dir);
  const std::string why = difference(m, r, text::tokenizer_identity(tokenizer));
  if (!why.empty())
    throw ConfigError("[data] tokenized_path " + dir.string() +
                      ": its examples would train something else: " + why +
                      "; remove the directory (or name a new one) to encode the datasets again");
  SftExamples e;
  const std::size_t n = m.at("tokens");
  e.input_ids = read_ints(dir / "input_ids.bin", n);
  e.labels = read_ints(dir / "labels.bin", n);
  e.starts = m.at("starts").get<std::vector<std::size_t>>();
  e.where = m.at("where").get<std::vector<std::string>>();
  e.bad_rows = m.at("bad_rows");
  e.bad = m.at("bad").get<std::vector<std::string>>();
  e.files = m.at("read").get<std::vector<std::string>>();
  e.files.push_back((dir / kManifest).string());
  e.tokenizer = m.at("tokenizer");
  e.tokenizer_identity = m.at("tokenizer_identity");
  e.chat_template = m.at("chat_template");
  e.chat_template_file = m.at("chat_template_file");
  e.chat_template_text = m.at("chat_template_text");
  if (e.starts.empty() || e.starts.back() != n || e.where.size() + 1 != e.starts.size())
    throw DataError(dir.string() + "/" + kManifest +
                    ": its starts do not cover its ids; remove the directory to encode the "
                    "datasets again");
  return e;
}

}  // namespace

SftExamples TokenizedReader::read(const SftRequest& r) const {
  if (r.tokenized_path.empty()) return inner_.read(r);
  const fs::path dir = r.tokenized_path;
  if (fs::exists(dir / kManifest)) return load(dir, r);
  if (fs::exists(dir) && !fs::is_empty(dir))
    throw ConfigError("[data] tokenized_path " + dir.string() +
                      " holds no tokenized.json: not examples ztrain saved (LLaMA-Factory's own "
                      "saves are Arrow datasets, which ztrain does not read); name a new "
                      "directory and ztrain saves its own there");
  SftExamples e = inner_.read(r);
  save(dir, r, e);
  return e;
}

}  // namespace ztrain
