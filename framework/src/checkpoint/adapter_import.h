// A PEFT adapter directory as the starting values of a LoRA run's adapters
// (`[model] adapter_from`, LLaMA-Factory's adapter_name_or_path): what
// PEFT's save_pretrained writes, and what a ztrain export puts in
// OUT/adapter/.
//
// adapter_config.json must describe the run's adapters (a LoRA of the
// same rank, alpha and scaling (use_rslora); no DoRA, trained biases or extra modules,
// which ztrain does not build), and adapter_model.safetensors must hold
// every adapter of the run under PEFT's names ("base_model.model." and
// the weight's Hugging Face name), each of its shape, and no other LoRA
// tensor: a different lora_target would train something else. The
// adapters enter through Strategy::load_state with a fresh optimizer, as
// init_from's weights do; every rank reads the (small) file itself.
//
// Errors: ConfigError naming the key for a configuration that differs;
// DataError naming the file for a missing, unexpected or mis-shaped tensor,
// on every rank when any rank finds one.
// Thread safety: collective; the training thread only.
#pragma once

#include <filesystem>

#include "ztrain/comm.h"
#include "ztrain/model.h"
#include "ztrain/strategy.h"

namespace ztrain {

// `where`: the key's place in the run file, for messages.
void import_adapter(const Model& model, Strategy& strategy, const std::filesystem::path& dir,
                    const std::string& where, Communicator& comm);

}  // namespace ztrain
