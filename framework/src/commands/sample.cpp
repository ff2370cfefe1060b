#include "commands/sample.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/hf_export.h"
#include "config/hf_model_import.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/generation.h"
#include "train/run_assembly.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;

std::optional<std::int32_t> token_id_of(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<std::int32_t>();
}

}  // namespace

std::vector<std::int32_t> sample(const SampleArgs& a, const PluginLoader& loader,
                                 std::ostream& out) {
  if (a.max_tokens < 1)
    throw ConfigError("--max-tokens " + std::to_string(a.max_tokens) + ": give 1 or more");
  if (a.temperature < 0 || !std::isfinite(a.temperature))
    throw ConfigError("--temperature must be 0 (greedy) or more");
  if (a.chat.empty() == a.prompt.empty())
    throw ConfigError(a.chat.empty() ? "--prompt is empty; give the text to continue, or --chat"
                                     : "give --prompt TEXT or --chat TEXT, not both");
  if (!a.system.empty() && a.chat.empty())
    throw ConfigError("--system goes with --chat: the system message of a conversation");
  const fs::path tok_file = a.tokenizer.empty() ? text::tokenizer_in(a.dir) : a.tokenizer;
  if (tok_file.empty() || !fs::exists(tok_file))
    throw ConfigError(
        "no tokenizer " +
        (tok_file.empty() ? "in '" + a.dir.string() + "'" : "at '" + tok_file.string() + "'") +
        "; give one with --tokenizer tokenizer.json");
  const auto tok = text::load_tokenizer(tok_file);
  std::ifstream cfg_in(a.dir / "config.json");
  const auto config = nlohmann::json::parse(cfg_in, nullptr, false);
  RunConfig run_config = RunConfig::parse(
      "[model]\nfrom = " + nlohmann::json(a.dir.string()).dump() +
          "\n[data]\nplugin = \"synthetic\"\n[train]\nmicro_batch_size = 1\nsave_final = false\n",
      "ztrain sample");
  resolve_model_dir(run_config);
  Run run = assemble(run_config, loader);

  std::vector<std::int32_t> ids;
  std::optional<std::int32_t> stop = token_id_of(config, "eos_token_id");
  if (!a.chat.empty()) {
    std::vector<text::ChatMessage> messages;
    if (!a.system.empty()) messages.push_back({"system", a.system});
    messages.push_back({"user", a.chat});
    ids = tok->encode(text::ChatTemplate::from_model_dir(a.dir).render(messages, true));
    if (const auto eos = text::config_token(tok_file, "eos_token"))
      if (const auto id = tok->token_id(*eos)) stop = id;
  } else {
    if (const auto bos = token_id_of(config, "bos_token_id")) ids.push_back(*bos);
    for (const std::int32_t id : tok->encode(a.prompt)) ids.push_back(id);
    out << a.prompt << std::flush;
  }
  if (ids.empty())
    throw ConfigError(a.chat.empty() ? "--prompt is empty; give the text to continue"
                                     : "the chat template rendered nothing to answer");
  Arena arena(*run.device);
  LossSum losses(*run.device, *run.kernels);
  std::string shown;
  // Print what the text gained, once it is whole characters.
  const auto show = [&](const std::vector<std::int32_t>& made) {
    const std::string text = tok->decode(made);
    if (text.rfind(shown, 0) == 0 && text.find("\xEF\xBF\xBD", shown.size()) == std::string::npos) {
      out << text.substr(shown.size()) << std::flush;
      shown = text;
    }
  };
  const GenerationSettings settings{a.max_tokens, a.temperature, a.top_k, a.seed, stop};
  const std::vector<std::int32_t> made = generate(run, arena, losses, ids, settings, show);
  const std::string text = tok->decode(made);
  if (text.rfind(shown, 0) == 0) out << text.substr(shown.size());
  out << "\n";
  return made;
}

}  // namespace ztrain
