#include "checkpoint/weights.h"

#include <algorithm>
#include <fstream>

#include "checkpoint/hf_export.h"
#include "io/durable_file.h"
#include "io/safetensors.h"
#include "text/tokenizer.h"
#include "ztrain/error.h"
#include "ztrain/version.h"

namespace ztrain {
namespace fs = std::filesystem;

std::string external_name(const ParamSpec& p) {
  return p.hf_name.empty() ? p.name : p.hf_name;
}

Shape external_shape(const ParamSpec& p) {
  if (!p.hf_transposed) return p.shape;
  return Shape{p.shape[1], p.shape[0]};
}

namespace {

// (rows, cols) row-major -> (cols, rows)
void transpose(const float* in, float* out, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

// Where the tensors of an export to `out` go: `out` itself when it names a
// .safetensors file, else out/model.safetensors, with `config_json` (when
// non-empty; its torch_dtype and token ids set, checkpoint/hf_export.h) and
// the tokenizer and chat template (when known) beside it.
fs::path prepare_target(const fs::path& out, const std::string& config_json, DType dtype,
                        const TextFiles& text) {
  if (out.extension() == ".safetensors") return out;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw DataError("cannot create export directory '" + out.string() + "': " + ec.message());
  if (!config_json.empty())
    write_file_atomically(out / "config.json",
                          export_config_json(config_json, dtype, text.tokenizer));
  copy_text_files(text, out);
  return out / "model.safetensors";
}

}  // namespace

void write_weights(const Model& model, const fs::path& out, DType dtype, const ReadParam& read,
                   const TextFiles& text) {
  const auto params = model.params();
  std::vector<SafetensorsTensor> tensors;
  for (const ParamSpec& p : params) tensors.push_back({external_name(p), dtype, external_shape(p)});
  SafetensorsWriter writer(prepare_target(out, model.hf_config_json(), dtype, text), tensors,
                           {{"format", "pt"},
                            {"producer", std::string("ztrain ") + ZTRAIN_VERSION},
                            {"arch", model.info().arch}});
  std::vector<float> full, flipped;
  std::vector<std::uint8_t> bytes;
  for (ParamId id : params.ids()) {
    const ParamSpec& p = params[id];
    full.resize(static_cast<std::size_t>(p.shape.numel()));
    read(id, full.data());
    const float* src = full.data();
    if (p.hf_transposed) {
      flipped.resize(full.size());
      transpose(full.data(), flipped.data(), p.shape[0], p.shape[1]);
      src = flipped.data();
    }
    bytes.resize(full.size() * dtype_size(dtype));
    convert(src, DType::f32, bytes.data(), dtype, full.size());
    writer.put(bytes.data());
  }
  writer.finish();
}

void export_weights(const Model& model, Strategy& strategy, const fs::path& out, DType dtype,
                    bool write, const TextFiles& text) {
  if (write)
    return write_weights(
        model, out, dtype, [&](ParamId p, float* values) { strategy.read_param(p, values); }, text);
  std::vector<float> full;
  const auto params = model.params();
  for (ParamId p : params.ids()) {
    full.resize(static_cast<std::size_t>(params[p].shape.numel()));
    strategy.read_param(p, full.data());
  }
}

void check_export_target(const fs::path& out, bool overwrite, const fs::path& source) {
  const fs::path landing = out.extension() == ".safetensors" ? out : out / "model.safetensors";
  std::error_code ec;
  if (!source.empty() && fs::exists(landing) && fs::equivalent(landing, source, ec))
    throw ConfigError("export: '" + landing.string() +
                      "' is the source itself; writing there would replace the weights being "
                      "read; choose another OUT");
  if (fs::exists(landing) && !overwrite)
    throw ConfigError("export: '" + landing.string() +
                      "' exists; choose another OUT, or pass --overwrite to replace it");
}

void convert_weights(const fs::path& source, const fs::path& out, DType dtype, bool overwrite) {
  const bool dir = fs::is_directory(source);
  const fs::path file = dir ? source / "model.safetensors" : source;
  if (!fs::exists(file))
    throw DataError("no weights at '" + file.string() + "'" +
                    (dir ? "; is this a ztrain run directory of a finished run?" : ""));
  // Where the weights would land, checked before anything is written.
  check_export_target(out, overwrite, file);
  const SafetensorsReader in(file);
  std::string config_json;
  if (dir && fs::exists(source / "config.json")) {
    std::ifstream cfg(source / "config.json");
    config_json.assign(std::istreambuf_iterator<char>(cfg), {});
  }
  const TextFiles files{dir ? text::tokenizer_in(source) : fs::path()};
  const fs::path target = prepare_target(out, config_json, dtype, files);
  std::vector<std::vector<std::uint8_t>> storage;
  std::vector<SafetensorsTensor> tensors;
  std::vector<float> values;
  for (const auto& e : in.entries()) {
    values.resize(static_cast<std::size_t>(e.shape.numel()));
    in.read_f32(e, values.data());
    storage.emplace_back(values.size() * dtype_size(dtype));
    convert(values.data(), DType::f32, storage.back().data(), dtype, values.size());
    tensors.push_back({e.name, dtype, e.shape, storage.back().data()});
  }
  auto meta = in.metadata();
  meta["format"] = "pt";
  write_safetensors(target, tensors, meta);
}

}  // namespace ztrain
