#include "checkpoint/hf_export.h"

#include <nlohmann/json.hpp>
#include <optional>

#include "io/durable_file.h"
#include "text/tokenizer.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const char* torch_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return "float32";
    case DType::bf16:
      return "bfloat16";
    case DType::f16:
      return "float16";
  }
  return "float32";
}

}  // namespace

std::string export_config_json(const std::string& config_json, DType dtype,
                               const fs::path& tokenizer) {
  json config = json::parse(config_json);
  config["torch_dtype"] = torch_dtype(dtype);
  config["bos_token_id"] = nullptr;
  config["eos_token_id"] = nullptr;
  if (!tokenizer.empty()) {
    const auto tok = text::load_tokenizer(tokenizer);
    std::optional<std::string> bos = text::config_token(tokenizer, "bos_token");
    if (!bos) bos = tok->bos_token();
    const std::optional<std::string> eos = text::config_token(tokenizer, "eos_token");
    const json vocab_size = config.value("vocab_size", json());
    for (const auto& [key, token] :
         {std::pair{"bos_token_id", bos}, std::pair{"eos_token_id", eos}}) {
      if (!token) continue;
      const auto id = tok->token_id(*token);
      // An id past the model's vocabulary stays null: transformers would index past it.
      if (id && (!vocab_size.is_number() || *id < vocab_size.get<std::int64_t>()))
        config[key] = *id;
    }
  }
  return config.dump(2) + "\n";
}

namespace {

// Whether the tokenizer_config.json beside `tokenizer` holds a template.
bool has_config_template(const fs::path& tokenizer) {
  const fs::path file = tokenizer.parent_path() / "tokenizer_config.json";
  if (!fs::exists(file)) return false;
  const json config = json::parse(read_whole_file(file), nullptr, false);
  return config.is_object() && config.contains("chat_template") &&
         !config["chat_template"].is_null();
}

}  // namespace

void copy_text_files(const TextFiles& files, const fs::path& dir) {
  const fs::path& tokenizer = files.tokenizer;
  if (tokenizer.empty()) return;
  const char* name = tokenizer.extension() == ".model" ? "tokenizer.model" : "tokenizer.json";
  write_file_atomically(dir / name, read_whole_file(tokenizer));
  for (const char* beside : {"tokenizer_config.json", "special_tokens_map.json"})
    if (fs::exists(tokenizer.parent_path() / beside))
      write_file_atomically(dir / beside, read_whole_file(tokenizer.parent_path() / beside));
  const fs::path chat = files.chat_template.empty()
                            ? tokenizer.parent_path() / "chat_template.jinja"
                            : files.chat_template;
  if (fs::exists(chat))
    write_file_atomically(dir / "chat_template.jinja", read_whole_file(chat));
  else if (!files.chat_template_text.empty() && !has_config_template(tokenizer))
    write_file_atomically(dir / "chat_template.jinja", files.chat_template_text + "\n");
}

}  // namespace ztrain
