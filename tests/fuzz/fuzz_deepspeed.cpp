// DeepSpeed configs: any bytes are read as a ds_config.json against a run
// with a model (so "auto" bucket sizes resolve) and either become ztrain
// keys or are refused with a ztrain error; what is accepted prints as TOML
// that parses again.
#include "config/deepspeed_import.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const ztrain::RunConfig run = ztrain::RunConfig::parse(
      "[model]\nn_embd = 64\n[train]\nprecision = \"fp32\"\nglobal_batch_size = 8\n", "run.toml");
  const auto file = ztrain::fuzz::as_file(data, size);
  ztrain::fuzz::expect_clean([&] {
    const ztrain::ImportedConfig c = ztrain::import_deepspeed(file, run);
    const std::string text = ztrain::imported_toml(c, file);
    // toml++ throws its parse_error, not a ztrain error: a finding.
    const toml::table again = toml::parse(text);
    if (again.empty()) __builtin_trap();
  });
  return 0;
}
