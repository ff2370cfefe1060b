// `ztrain sample DIR --prompt TEXT`: text from a trained model, for the
// "does it talk yet" look after training. DIR is a run directory or an
// exported model (Hugging Face layout: config.json, model.safetensors,
// tokenizer.json or tokenizer.model beside them), read as `--model DIR`
// reads it. The prompt is tokenized with DIR's tokenizer (or --tokenizer),
// after config.json's bos_token_id when it has one (as the documents were
// prepared); the tokens are chosen as train/generation.h says (greedy at
// temperature 0, else drawn over the top_k largest, seeded). Generation
// stops after max_tokens or at config.json's eos_token_id. The text is
// printed as it grows, whole characters at a time.
// With --chat the prompt is a conversation instead: an optional system
// message and the user's, rendered by DIR's chat template with the
// generation prompt (text/chat_template.h) and tokenized as it is (the
// template writes its own special tokens); only the answer is printed,
// and it stops at tokenizer_config.json's eos_token, the token chat
// templates end a turn with, where DIR names one.
//
// Errors: ConfigError / DataError from loading; Error when DIR's model has
// no logits to sample from. Thread safety: call from the main thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

namespace ztrain {

class PluginLoader;

struct SampleArgs {
  std::filesystem::path dir;
  std::filesystem::path tokenizer;  // empty: DIR/tokenizer.json, else DIR/tokenizer.model
  std::string prompt;
  std::string chat;    // instead of prompt: the user's message
  std::string system;  // with chat: a system message before it
  int max_tokens = 64;
  double temperature = 0;  // 0: greedy
  int top_k = 0;           // 0: every token
  std::uint64_t seed = 0;
};

// The continuation's token ids, after printing prompt and continuation.
std::vector<std::int32_t> sample(const SampleArgs& args, const PluginLoader& loader,
                                 std::ostream& out);

}  // namespace ztrain
