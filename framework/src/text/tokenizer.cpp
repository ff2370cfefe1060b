#include "text/tokenizer.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "text/hf_tokenizer.h"
#include "text/sentencepiece_tokenizer.h"
#include "ztrain/error.h"

namespace ztrain::text {

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& file) {
  if (file.extension() == ".model") return load_sentencepiece(file);
  return load_hf_tokenizer(file);
}

std::string tokenizer_identity(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataError("cannot read tokenizer '" + file.string() + "'");
  std::ostringstream all;
  all << in.rdbuf();
  std::string bytes = all.str();
  if (file.extension() != ".model") {
    const auto j = nlohmann::json::parse(bytes, nullptr, false);
    if (!j.is_discarded()) bytes = j.dump();  // nlohmann's objects keep their keys sorted
  }
  // FNV-1a, 64 bits: an identity to compare, not a defence against forgery.
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::filesystem::path tokenizer_in(const std::filesystem::path& dir) {
  for (const char* name : {"tokenizer.json", "tokenizer.model"})
    if (std::filesystem::exists(dir / name)) return dir / name;
  return {};
}

std::optional<std::string> config_token(const std::filesystem::path& file, const char* key) {
  std::ifstream in(file.parent_path() / "tokenizer_config.json");
  if (!in) return std::nullopt;
  const auto config = nlohmann::json::parse(in, nullptr, false);
  const auto it = config.is_object() ? config.find(key) : config.end();
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return (*it)["content"].get<std::string>();
  return std::nullopt;
}

bool config_flag(const std::filesystem::path& file, const char* key) {
  std::ifstream in(file.parent_path() / "tokenizer_config.json");
  if (!in) return false;
  const auto config = nlohmann::json::parse(in, nullptr, false);
  const auto it = config.is_object() ? config.find(key) : config.end();
  return it != config.end() && it->is_boolean() && it->get<bool>();
}

std::optional<std::string> document_start(const Tokenizer& tok, const std::filesystem::path& file) {
  if (const auto bos = tok.bos_token()) return bos;
  if (auto bos = config_token(file, "bos_token")) return bos;
  return config_token(file, "eos_token");
}

}  // namespace ztrain::text
