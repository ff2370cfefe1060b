// LLaMA-Factory's fine-tuning datasets, read as LLaMA-Factory reads them:
// dataset_info.json in a dataset directory names each dataset's file
// (file_name: a JSON array, JSON lines, or a folder of them), its
// formatting ("alpaca", "sharegpt" or "openai"), its columns and, for
// conversations, its role tags; each row is aligned into one example as
// LLaMA-Factory's converters align it (data/converter.py): a system
// message, the tools (JSON text), and turns alternating user/observation
// and assistant/function, the last one the answer. Alpaca's prompt is
// instruction + "\n" + input (each when not empty), after its history's
// pairs; openai's tool calls become function turns, its tool results one
// observation turn, and its system message what LLaMA-Factory makes of it
// (its "detailed thinking off" included).
//
// A row that breaks its format (not an object, a missing column, a wrong
// role at its place, an odd number of turns, an empty answer) is not
// silently dropped: it is counted, and the first ones are kept with their
// file:line and what is wrong. An empty answer is such a row here, where
// LLaMA-Factory trains on it: it has nothing to train on. Several datasets are concatenated in the
// order given (LLaMA-Factory's mix_strategy "concat").
//
// Errors: ConfigError naming dataset_info.json and the key for a dataset
// it does not name, one that needs the hub (hf_hub_url, ms_hub_url, ...;
// give a local file_name), ranking (preference) data, a formatting or file
// type that is not built; DataError naming the file for one that cannot
// be read or parsed. Thread safety: a pure function of the files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "text/chat_template.h"

namespace ztrain::text {

struct SftExample {
  std::string system;
  std::string tools;  // the tools column as JSON text; empty: none
  // LLaMA-Factory's roles: user and observation turns alternate with
  // assistant and function turns; the last turn is the answer (assistant
  // or function).
  std::vector<ChatMessage> turns;
  std::string where;  // file:line of the row
};

// How many bad rows are named; the rest are counted.
inline constexpr std::size_t kBadRowsKept = 20;

struct SftDataset {
  std::vector<SftExample> examples;
  std::size_t bad_rows = 0;
  // The first bad rows: "file:line: what is wrong".
  std::vector<std::string> bad;
  std::vector<std::string> files;  // read: dataset_info.json, then the data files
};

// Which rows of each dataset are taken: dataset_info.json's num_samples
// draws from the seed, then each dataset's first max_samples (0: all).
struct SftSampling {
  std::size_t max_samples = 0;
  std::uint64_t seed = 0;
  // LLaMA-Factory's pt stage: an alpaca row needs its prompt alone (its
  // response, if any, is not read); other formats are refused.
  bool pretrain = false;
};

// The named datasets of dataset_dir/dataset_info.json, in order.
SftDataset read_sft_datasets(const std::filesystem::path& dataset_dir,
                             const std::vector<std::string>& names,
                             const SftSampling& sampling = {});

}  // namespace ztrain::text
