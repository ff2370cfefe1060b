#include "text/sft_encoding.h"

#include <algorithm>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "text/llamafactory_tools.h"
#include "ztrain/error.h"
#include "ztrain/kernels.h"

namespace ztrain::text {
namespace {

using json = nlohmann::ordered_json;

// The rendered conversation cut at its answers: the text before each
// answer is that pair's prompt; what follows the last answer joins it.
std::vector<TurnPair> pairs_of(const RenderedChat& r, const Tokenizer& tokenizer) {
  std::vector<TurnPair> pairs;
  std::size_t at = 0;
  for (std::size_t k = 0; k < r.answers.size(); ++k) {
    const auto [begin, end] = r.answers[k];
    const std::size_t stop = k + 1 == r.answers.size() ? r.text.size() : end;
    pairs.push_back({tokenizer.encode(std::string_view(r.text).substr(at, begin - at)),
                     tokenizer.encode(std::string_view(r.text).substr(begin, stop - begin))});
    at = stop;
  }
  return pairs;
}

// LLaMA-Factory's function turn as transformers' tool_calls.
std::string tool_calls_of(const std::string& content) {
  json calls = json::array();
  for (const json& call : function_calls(content))
    calls.push_back(
        {{"type", "function"},
         {"function",
          {{"name", call["name"]}, {"arguments", call.value("arguments", json::object())}}}});
  return calls.dump();
}

}  // namespace

std::vector<ChatMessage> chat_messages(const SftExample& example) {
  std::vector<ChatMessage> out;
  if (!example.system.empty()) out.push_back({"system", example.system});
  for (const ChatMessage& m : example.turns) {
    if (m.role == "function")
      out.push_back({"assistant", "", tool_calls_of(m.content)});
    else
      out.push_back({m.role == "observation" ? "tool" : m.role, m.content});
  }
  return out;
}

std::string chat_tools(const SftExample& example) {
  const json tools = json::parse(example.tools, nullptr, false);
  return tools.is_array() && tools.empty() ? std::string() : example.tools;
}

std::pair<std::size_t, std::size_t> truncated_lengths(std::size_t source, std::size_t target,
                                                      std::size_t cutoff) {
  std::size_t max_target = 0;
  if (target * 2 < cutoff)
    max_target = cutoff;
  else if (source * 2 < cutoff)
    max_target = cutoff - source;
  else  // Python's int() of the float share, as LLaMA-Factory computes it
    max_target = static_cast<std::size_t>(
        static_cast<double>(cutoff) *
        (static_cast<double>(target) / static_cast<double>(source + target)));
  const std::size_t new_target = std::min(max_target, target);
  const std::size_t max_source = cutoff > new_target ? cutoff - new_target : 0;
  return {std::min(max_source, source), new_target};
}

EncodedExample encode_example(const ChatTemplate& chat, const Tokenizer& tokenizer,
                              const SftExample& example, const SftEncoding& o) {
  std::vector<TurnPair> pairs =
      pairs_of(chat.render_with_answers(chat_messages(example), chat_tools(example)), tokenizer);
  if (pairs.empty())
    throw DataError(example.where + ": the chat template marks no answer in this example");
  return encode_pairs(std::move(pairs), o);
}

EncodedExample encode_example(const LlamaFactoryTemplate& chat, const SftExample& example,
                              const SftEncoding& o) {
  // supervised.py discards the history's thoughts under mask_history
  // (preserve_thinking is off by default and not a ztrain key).
  return encode_pairs(chat.pairs(example, o.mask_history), o);
}

// supervised.py's _encode_data_example, without the multimodal and
// efficient_eos parts (no template ztrain builds needs them).
EncodedExample encode_pairs(std::vector<TurnPair> pairs, const SftEncoding& o) {
  if (o.mask_history) std::reverse(pairs.begin(), pairs.end());
  EncodedExample out;
  std::size_t total = 0;
  for (std::size_t turn = 0; turn < pairs.size() && total < o.cutoff_len; ++turn) {
    TurnPair& p = pairs[turn];
    const auto [source_len, target_len] =
        truncated_lengths(p.source.size(), p.target.size(), o.cutoff_len - total);
    p.source.resize(source_len);
    p.target.resize(target_len);
    total += source_len + target_len;
    std::vector<std::int32_t> ids = p.source, labels;
    ids.insert(ids.end(), p.target.begin(), p.target.end());
    labels = o.train_on_prompt ? p.source : std::vector<std::int32_t>(source_len, kIgnoreTarget);
    if (o.mask_history && turn != 0)
      labels.insert(labels.end(), target_len, kIgnoreTarget);
    else
      labels.insert(labels.end(), p.target.begin(), p.target.end());
    if (o.mask_history) {  // taken from the last pair back
      out.input_ids.insert(out.input_ids.begin(), ids.begin(), ids.end());
      out.labels.insert(out.labels.begin(), labels.begin(), labels.end());
    } else {
      out.input_ids.insert(out.input_ids.end(), ids.begin(), ids.end());
      out.labels.insert(out.labels.end(), labels.begin(), labels.end());
    }
  }
  return out;
}

}  // namespace ztrain::text
