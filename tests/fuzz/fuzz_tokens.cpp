// Token files (llm.c headers, nanoGPT), through the tokens plugin as a run
// loads it: format "auto", windows of both splits read.
#include <memory>

#include "config/section_options.h"
#include "fuzz_input.h"
#include "loader/plugin_loader.h"
#include "ztrain/data.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const ztrain::PluginLoader loader({ZTRAIN_FUZZ_PLUGIN_DIR}, {});
  static const ztrain::LoadedPlugin plugin = loader.load("data", "tokens");
  const auto path = ztrain::fuzz::as_file(data, size);
  ztrain::fuzz::expect_clean([&] {
    const auto config = ztrain::RunConfig::parse(
        "[data]\nplugin = \"tokens\"\nshuffle = false\npath = \"" + path.string() + "\"\n", "fuzz");
    const auto source = plugin.create<ztrain::DataSource>(
        ztrain::plugin_options(config, "data", plugin, ztrain::data_host_options()));
    constexpr int T = 8;
    source->setup({T, 70000, 1});
    std::int32_t in[T], out[T];
    for (auto split : {ztrain::Split::train, ztrain::Split::val})
      for (std::uint64_t i = 0; i < 4; ++i) source->fill(split, i, in, out);
  });
  return 0;
}
