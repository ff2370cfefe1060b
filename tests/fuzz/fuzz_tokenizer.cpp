// Tokenizer files (a Hugging Face tokenizer.json) through the loader
// `ztrain prepare` and `ztrain sample` use, then text through the loaded
// tokenizer and back.
#include "fuzz_input.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = ztrain::fuzz::as_file(data, size);
  ztrain::fuzz::expect_clean([&] {
    const auto tok = ztrain::text::load_tokenizer(path);
    for (const char* text : {"Hello, world!", " caf\xC3\xA9  \xF0\x9F\x9A\x80\n\tx", ""}) {
      const auto ids = tok->encode(text);
      tok->decode(ids);
    }
    ztrain::text::tokenizer_identity(path);
  });
  return 0;
}
