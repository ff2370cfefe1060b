// The documents `ztrain prepare` reads: the input as a whole text file and
// as JSON lines, refused or read to the end, with invalid UTF-8 refused and
// then replaced.
#include <filesystem>

#include "fuzz_input.h"
#include "text/documents.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = ztrain::fuzz::as_file(data, size);
  const auto lines = std::filesystem::path(path.string() + ".jsonl");
  std::filesystem::copy_file(path, lines, std::filesystem::copy_options::overwrite_existing);
  for (const bool replace : {false, true})
    ztrain::fuzz::expect_clean([&] {
      ztrain::text::DocumentReader reader({path.string(), lines.string()}, {"text", replace});
      while (reader.next()) {
      }
    });
  return 0;
}
