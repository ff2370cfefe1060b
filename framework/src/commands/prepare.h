// `ztrain prepare`: text into the token files a run trains on. Documents
// (text files, globs, JSON lines with a named field; text/documents.h) are
// tokenized with a Hugging Face tokenizer.json (text/tokenizer.h) on every
// core, in batches whose results are written in input order, so the output
// does not depend on the thread count; each document starts with the
// separator token (the tokenizer's BOS, or its EOS where it has no BOS, as
// GPT-2 and Llama are trained; --separator names another, or none). Ids go
// to llm.c shards (commands/token_shards.h): uint16 when the vocabulary
// fits, else uint32; a held-out split takes the first documents up to
// --val-tokens, or each document with probability --val-fraction (a hash
// of its index: the same documents on every run). manifest.json beside the
// shards records the tokenizer (file, CRC-32C, vocabulary size), the
// separator, the inputs and the documents and tokens of each split; the
// tokens plugin checks a run's vocab_size against it.
//
// Errors: ConfigError for arguments and a tokenizer that is not read;
// DataError for inputs and writes; an output directory holding shards is
// refused unless overwrite. Thread safety: call from the main thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace ztrain {

struct PrepareArgs {
  std::filesystem::path tokenizer;  // tokenizer.json
  std::vector<std::string> inputs;  // files and glob patterns
  std::filesystem::path out;
  std::string text_field = "text";  // of JSON lines
  std::uint64_t shard_tokens = 100'000'000;
  std::uint64_t val_tokens = 0;
  double val_fraction = 0;
  std::optional<std::string> separator;  // a token, or "none"; unset: the tokenizer's
  bool overwrite = false;
  // Bytes that are not UTF-8 read as U+FFFD instead of refused.
  bool replace_invalid_utf8 = false;
};

// Prints progress and a summary to `log`; returns the process's status.
int prepare(const PrepareArgs& args, std::ostream& log);

}  // namespace ztrain
