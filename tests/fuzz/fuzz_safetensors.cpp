// safetensors files: header, metadata and every tensor read as fp32.
#include <vector>

#include "fuzz_input.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = ztrain::fuzz::as_file(data, size);
  ztrain::fuzz::expect_clean([&] {
    const ztrain::SafetensorsReader file(path);
    std::vector<float> values;
    for (const auto& e : file.entries()) {
      values.resize(static_cast<std::size_t>(e.shape.numel()));
      file.read_f32(e, values.data());
    }
  });
  return 0;
}
