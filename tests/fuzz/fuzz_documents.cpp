// The documents `ztrain prepare` reads: the input as a whole text file and
// as JSON lines, refused or read to the end, with invalid UTF-8 refused and
// then replaced.
#include <filesystem>
#include <fstream>

#include "fuzz_input.h"
#include "text/documents.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = ztrain::fuzz::as_file(data, size);
  // The same bytes under a JSON-lines name, written directly (copy_file
  // can fail with EINTR under libFuzzer's timers).
  const auto lines = std::filesystem::path(path.string() + ".jsonl");
  std::ofstream(lines, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  for (const bool replace : {false, true})
    ztrain::fuzz::expect_clean([&] {
      ztrain::text::DocumentReader reader({path.string(), lines.string()}, {"text", replace});
      while (reader.next()) {
      }
    });
  return 0;
}
