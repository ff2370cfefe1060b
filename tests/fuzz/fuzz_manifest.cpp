// Checkpoint manifests: any text is parsed and checked (structure, pieces
// inside their files, tiling) or refused with a ztrain error; what parses
// is written back and must parse to the same pieces.
#include "checkpoint/manifest.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input = ztrain::fuzz::text(data, size);
  ztrain::fuzz::expect_clean([&] {
    const ztrain::Manifest m = ztrain::parse_manifest(input, "fuzz-manifest.json");
    const ztrain::Manifest again =
        ztrain::parse_manifest(ztrain::manifest_json(m), "fuzz-manifest-again.json");
    if (again.params.size() != m.params.size() || again.files.size() != m.files.size())
      __builtin_trap();
  });
  return 0;
}
