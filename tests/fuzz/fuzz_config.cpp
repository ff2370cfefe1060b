// The run-file loader and validators: TOML text, an optional first line
// "--set" override, then every host section validated and resolved.
#include "config/config.h"
#include "config/run_settings.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input = ztrain::fuzz::text(data, size);
  const auto nl = input.find('\n');
  const std::string first = input.substr(0, nl),
                    rest = nl == std::string::npos ? "" : input.substr(nl + 1);
  ztrain::fuzz::expect_clean([&] {
    ztrain::RunConfig config = ztrain::RunConfig::parse(rest, "fuzz.toml");
    if (first.rfind("set ", 0) == 0) config.override_with(first.substr(4));
    config.check_sections(ztrain::run_file_sections());
    for (int world : {1, 3}) ztrain::resolve_settings(config, world);
  });
  return 0;
}
