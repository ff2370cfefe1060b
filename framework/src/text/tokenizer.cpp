#include "text/tokenizer.h"

#include "text/hf_tokenizer.h"
#include "text/sentencepiece_tokenizer.h"

namespace ztrain::text {

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& file) {
  if (file.extension() == ".model") return load_sentencepiece(file);
  return load_hf_tokenizer(file);
}

}  // namespace ztrain::text
