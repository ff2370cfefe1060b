// ELF section headers, as the plugin loader reads a candidate plugin file
// before loading it: the file is whatever lies in a plugin directory.
#include "fuzz_input.h"
#include "loader/elf_sections.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = ztrain::fuzz::as_file(data, size);
  ztrain::fuzz::expect_clean([&] {
    ztrain::read_elf_sections(path, {"ztrain", "ztrain_abi"}, 4096);
  });
  return 0;
}
