// A Hugging Face model directory as the run's model: `--model DIR` or
// `[model] from = "DIR"` reads DIR/config.json into the transformer
// plugin's [model] keys and starts from DIR's weights (init_from = DIR:
// model.safetensors, or the shards of model.safetensors.index.json).
//
// GPT-2 (model_type gpt2) and the Llama family (llama, mistral; TinyLlama
// and Llama 1/2/3 are llama) are mapped key by key; every key that changes
// the computation is mapped or refused naming it with file:key (RoPE
// scaling, a sliding window shorter than seq_len, q/k/v biases, tied Llama
// embeddings, another activation...), never dropped. Keys that change
// nothing here (token ids, dtype, use_cache, ...) are read silently; any
// other key is refused, so a new kind of model is never run as an old one.
// Dropout (GPT-2's 0.1) is said in a note: ztrain trains without it, as
// llm.c and nanoGPT's pretraining do. Keys the run gives beside `from`
// win, each said in a note when it differs from the import (seq_len is
// the usual one: RoPE models take max_position_embeddings up to 2048 by
// default).
//
// Errors: ConfigError. Thread safety: reads files; one thread.
#pragma once

#include "config/config.h"

namespace ztrain {

// Replaces [model] from = DIR (or, for --model DIR, [model] itself) with
// the imported keys, merged under the ones the run gives. Nothing when
// [model] has no `from`.
void resolve_model_dir(RunConfig& config);

}  // namespace ztrain
