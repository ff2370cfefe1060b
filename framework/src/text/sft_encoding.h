// One fine-tuning example as token ids and labels, as LLaMA-Factory's
// supervised preprocessing makes them (data/processor/supervised.py):
// the conversation rendered by the chat template (text/chat_template.h)
// is cut into (prompt, answer) pairs at the answers' spans, each piece
// tokenized on its own (or one of LLaMA-Factory's named templates makes
// the pairs as it does, text/llamafactory_template.h), and cutoff_len truncation applied pair by
// pair with its rule (infer_seqlen: the answer keeps its length while it is under half of what is
// left, the prompt gives way first). Prompt tokens get kIgnoreTarget labels unless train_on_prompt;
// with mask_history only the last answer is trained, and the pairs are taken from the last one
// back, so truncation drops the oldest turns. Text after the last answer
// (a closing only the whole conversation gets) joins that answer.
//
// labels are aligned with input_ids, as Hugging Face's are: a model
// predicting token t + 1 from 0..t is trained on labels[t + 1].
//
// Errors: what the template raises (ChatTemplate); DataError for an
// example with no answer to train on. Thread safety: pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "text/chat_template.h"
#include "text/llamafactory_template.h"
#include "text/sft_dataset.h"
#include "text/tokenizer.h"

namespace ztrain::text {

struct SftEncoding {
  std::size_t cutoff_len = 2048;  // LLaMA-Factory's default
  bool train_on_prompt = false;
  bool mask_history = false;
};

struct EncodedExample {
  std::vector<std::int32_t> input_ids;
  std::vector<std::int32_t> labels;  // kIgnoreTarget where not trained
};

// The example's messages as a chat template takes them: the system
// message first when there is one; LLaMA-Factory's function turns as the
// assistant's tool_calls (DataError for one that is not a JSON call or
// list of calls), observations as "tool" turns.
std::vector<ChatMessage> chat_messages(const SftExample& example);
// The example's tools as apply_chat_template's tools: its tools column;
// empty where there is none or it is an empty list.
std::string chat_tools(const SftExample& example);

// LLaMA-Factory's infer_seqlen: the (prompt, answer) lengths kept of a
// pair with `cutoff` tokens left.
std::pair<std::size_t, std::size_t> truncated_lengths(std::size_t source, std::size_t target,
                                                      std::size_t cutoff);

// The example's (prompt, answer) pairs, truncated and labelled.
EncodedExample encode_pairs(std::vector<TurnPair> pairs, const SftEncoding& options);

// Through a model's chat template: its render cut at the answers.
EncodedExample encode_example(const ChatTemplate& chat, const Tokenizer& tokenizer,
                              const SftExample& example, const SftEncoding& options);
// Through one of LLaMA-Factory's named templates (its own encode_multiturn).
EncodedExample encode_example(const LlamaFactoryTemplate& chat, const SftExample& example,
                              const SftEncoding& options);

}  // namespace ztrain::text
